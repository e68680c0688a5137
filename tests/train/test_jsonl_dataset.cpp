// The .jsonl dataset: the shipped example loads with the pixels its files hold, and every
// bad input fails in the constructor with a message naming the file:line and the value.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../support/json_mutants.h"
#include "data_test_util.h"
#include "mmsp/hf/safetensors.h"
#include "mmsp/model/vision/pixel_geometry.h"
#include "mmsp/train/data/jsonl_dataset.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using ::testing::HasSubstr;
using testing::source_path;
using testing::tiny_config;

const std::string kExample = "examples/data/data.jsonl";

// A fresh directory per test with `name` holding `lines`.
class JsonlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mmsp_jsonl_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* png : {"circle.png", "square.png", "triangle.png"})
      fs::copy_file(source_path("examples/data/") + png, dir_ / png);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::vector<std::string>& lines, const std::string& name = "bad.jsonl") {
    std::ofstream out(dir_ / name);
    for (const std::string& l : lines) out << l << "\n";
    return (dir_ / name).string();
  }
  std::string error_for(const std::vector<std::string>& lines) {
    const std::string path = write(lines);
    return error_of([&] { JsonlDataset d(path, tiny_config("tiny-qwen2-vl")); });
  }

  fs::path dir_;
};

// A good line: one 56 x 56 image (grid [1, 4, 4]: 4 placeholder tokens).
const std::string kGood =
    R"({"input_ids": [1, 151652, 151655, 151655, 151655, 151655, 151653, 3, 2], "images": [{"path": "circle.png"}]})";

TEST_F(JsonlTest, ShippedExampleLoads) {
  const auto config = tiny_config("tiny-qwen2-vl");
  const JsonlDataset data(source_path(kExample), config);
  ASSERT_EQ(data.size(), 4);
  EXPECT_THAT(data.describe(), HasSubstr("4 samples"));
  EXPECT_EQ(data.sequence(0).image_grid_thw, (std::vector<plan::Grid>{{1, 4, 4}}));  // from the file
  EXPECT_EQ(data.sequence(1).image_grid_thw, (std::vector<plan::Grid>{{1, 4, 6}}));  // given: resized
  EXPECT_EQ(data.sequence(2).image_grid_thw, (std::vector<plan::Grid>{{1, 4, 4}, {1, 8, 4}}));
  EXPECT_EQ(data.sequence(3).video_grid_thw, (std::vector<plan::Grid>{{2, 4, 4}}));  // 3 frames
  EXPECT_TRUE(data.sequence(2).loss_mask.empty());
  EXPECT_EQ(data.location(3), source_path(kExample) + ":4");
  for (int64_t i = 0; i < data.size(); ++i) {
    const plan::Sequence s = data.sequence(i);
    EXPECT_NO_THROW(plan::parse_sequence(s, config.conventions, i));
    for (size_t k = 0; k < s.image_grid_thw.size(); ++k) {
      const plan::Grid& g = s.image_grid_thw[k];
      EXPECT_EQ(data.image_pixels(i, k).sizes(), (std::vector<int64_t>{g[0] * g[1] * g[2], 3 * 2 * 14 * 14}));
    }
  }
  EXPECT_EQ(data.video_pixels(3, 0).sizes(), (std::vector<int64_t>{32, 1176}));
  // circle.png: background (40, 40, 40), a red disc of radius 12 at the centre.
  // Patch row 0 is the top-left patch: background only, in every channel and both frames.
  const model::PixelNorm n;
  const at::Tensor rows = data.image_pixels(0, 0).view({16, 3, 2, 14, 14});
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(rows[0][c].max().item<float>(), (40 / 255.0 - n.mean[c]) / n.std[c], 1e-5);
  // pixel (27, 27) is red: merge window 0 holds patches (0,0) (0,1) (1,0) (1,1); the
  // last of them covers pixels 14..27, so (27, 27) is its element [13][13].
  EXPECT_NEAR(rows[3][0][0][13][13].item<float>(), (1 - n.mean[0]) / n.std[0], 1e-5);
  EXPECT_NEAR(rows[3][1][1][13][13].item<float>(), (0 - n.mean[1]) / n.std[1], 1e-5);
}

TEST_F(JsonlTest, SafetensorsPixels) {
  at::manual_seed(3);
  const at::Tensor rows = at::randn({16, 1176});
  hf::save_safetensors((dir_ / "px.safetensors").string(),
                       {{"img", rows}, {"bad", at::zeros({4, 1176})}, {"batched", rows.unsqueeze(0)}});
  const std::string ids = R"("input_ids": [1, 151652, 151655, 151655, 151655, 151655, 151653, 2])";
  const std::string path = write({"{" + ids +
                                  R"(, "images": [{"safetensors": "px.safetensors", "tensor": "img"}],)"
                                  R"( "image_grid_thw": [[1, 4, 4]]})"},
                                 "ok.jsonl");
  const JsonlDataset data(path, tiny_config("tiny-qwen2-vl"));
  EXPECT_TRUE(at::equal(data.image_pixels(0, 0), rows));
  // A processor's batch dimension of one item (LLaVA's [1, C, S, S]) is taken as it is.
  const JsonlDataset batched(write({"{" + ids +
                                    R"(, "images": [{"safetensors": "px.safetensors", "tensor": )"
                                    R"("batched"}], "image_grid_thw": [[1, 4, 4]]})"},
                                   "batched.jsonl"),
                             tiny_config("tiny-qwen2-vl"));
  EXPECT_TRUE(at::equal(batched.image_pixels(0, 0), rows));
  EXPECT_THAT(error_for({"{" + ids +
                         R"(, "images": [{"safetensors": "px.safetensors", "tensor": "bad"}],)"
                         R"( "image_grid_thw": [[1, 4, 4]]})"}),
              HasSubstr("bad.jsonl:1: image 0: tensor \"bad\" has shape [4, 1176] but grid [1, 4, 4] needs [16, 1176] "
                        "(patches x channels*temporal_patch_size*patch_size^2), or [1, 16, 1176]"));
  EXPECT_THAT(error_for({"{" + ids + R"(, "images": [{"safetensors": "px.safetensors", "tensor": "img"}]})"}),
              HasSubstr("bad.jsonl:1: image 0 comes from safetensors, so image_grid_thw must give its grid"));
  EXPECT_THAT(error_for({"{" + ids +
                         R"(, "images": [{"safetensors": "px.safetensors", "tensor": "nope"}],)"
                         R"( "image_grid_thw": [[1, 4, 4]]})"}),
              HasSubstr("bad.jsonl:1: image 0: tensor \"nope\" is not in"));
}

TEST_F(JsonlTest, MissingImageFile) {
  const std::string e = error_for({kGood, R"({"input_ids": [1, 151652, 151655, 151655, 151655, 151655, 151653, 2],)"
                                          R"( "images": [{"path": "nothere.png"}]})"});
  EXPECT_THAT(e, HasSubstr("bad.jsonl:2: image 0 file \""));
  EXPECT_THAT(e, HasSubstr("nothere.png\" does not exist"));
}

// A path with a NUL in it, an entry with keys of two forms or of none, a path that loops:
// each refused by name (before, the NUL cut the path to another file that was read, the
// extra keys were ignored or silently won, and a loop was "does not exist").
TEST_F(JsonlTest, EntriesAndPathsAreReadWhole) {
  const std::string image = R"({"input_ids": [1, 151652, 151655, 151655, 151655, 151655, 151653, 2], "images": [)";
  const std::string video = R"({"input_ids": [1, 151652, 151656, 151656, 151656, 151656, 151653, 2], "videos": [)";
  EXPECT_THAT(error_for({image + R"({"path": "circle.png\u0000.jpg"}]})"}),
              HasSubstr(R"(bad.jsonl:1: image 0 path "circle.png\u0000.jpg" holds a NUL character (at byte 10); )"
                        "a path cannot hold one"));
  EXPECT_THAT(error_for({video + R"({"frames": ["circle.png", "circle.png\u0000"]}]})"}),
              HasSubstr("bad.jsonl:1: video 0 frame 1 path \"circle.png\\u0000\" holds a NUL character"));
  EXPECT_THAT(error_for({video + R"({"path": "circle.png\u0000.mp4", "frame_indices": [0]}]})"}),
              HasSubstr("bad.jsonl:1: video 0 path \"circle.png\\u0000.mp4\" holds a NUL character"));
  const std::string forms = R"(({"path": video file, "frame_indices": [...]}, {"frames": [paths...]} or )"
                            R"({"safetensors": ..., "tensor": ...}))";
  EXPECT_THAT(error_for({video + R"({"path": "a.mp4", "frame_indices": [0], "frames": ["circle.png"]}]})"}),
              HasSubstr("bad.jsonl:1: video 0 has both \"path\" and \"frames\": an entry is one of"));
  EXPECT_THAT(
      error_for({video + R"({"frames": ["circle.png"], "fps": 2}]})"}),
      HasSubstr("bad.jsonl:1: video 0 has the key \"fps\", which an entry with \"frames\" does not take " + forms));
  EXPECT_THAT(error_for({video + R"({"frames": ["circle.png"], "frame_indices": [0]}]})"}),
              HasSubstr("video 0 has the key \"frame_indices\", which an entry with \"frames\" does not take"));
  EXPECT_THAT(error_for({image + R"({"path": "circle.png", "safetensors": "px.safetensors", "tensor": "t"}]})"}),
              HasSubstr("bad.jsonl:1: image 0 has both \"path\" and \"safetensors\""));
  EXPECT_THAT(error_for({image + R"({"path": "circle.png", "grid": [1, 4, 4]}]})"}),
              HasSubstr("image 0 has the key \"grid\", which an entry with \"path\" does not take"));
  fs::create_symlink("loop.png", dir_ / "loop.png");
  fs::create_symlink("loop.mp4", dir_ / "loop.mp4");
  EXPECT_THAT(error_for({image + R"({"path": "loop.png"}]})"}),
              HasSubstr("loop.png\" is a loop of symbolic links (Too many levels of symbolic links)"));
  EXPECT_THAT(
      error_for({video + R"({"path": "loop.mp4", "frame_indices": [0]}]})"}),
      HasSubstr("bad.jsonl:1: video 0 file \"" + (dir_ / "loop.mp4").string() + "\" is a loop of symbolic links"));
  fs::create_directory(dir_ / "folder.png");
  EXPECT_THAT(error_for({image + R"({"path": "folder.png"}]})"}), HasSubstr("folder.png\" is a directory, not a file"));
  // The forms themselves still load.
  EXPECT_NO_THROW(JsonlDataset(write({video + R"({"frames": ["circle.png", "circle.png"]}]})"}, "ok.jsonl"),
                               tiny_config("tiny-qwen2-vl")));
}

TEST_F(JsonlTest, PlaceholderCountMismatch) {
  EXPECT_THAT(error_for({kGood, R"({"input_ids": [1, 151652, 151655, 151655, 151655, 151653, 2],)"
                                R"( "images": [{"path": "circle.png"}]})"}),
              HasSubstr("bad.jsonl:2: sequence 1: image 0 has 3 placeholder tokens but grid [1, 4, 4] "
                        "with spatial_merge_size 2 needs 4"));
}

TEST_F(JsonlTest, TokenBeyondVocab) {
  EXPECT_THAT(error_for({R"({"input_ids": [1, 5, 9, 151936, 2]})"}),
              HasSubstr("bad.jsonl:1: input_ids[3] = 151936 is outside the model's vocabulary 0..151935"));
  EXPECT_THAT(error_for({kGood, kGood, R"({"input_ids": [1, -4, 2]})"}),
              HasSubstr("bad.jsonl:3: input_ids[1] = -4 is outside"));
  EXPECT_THAT(error_for({R"({"input_ids": [1, 2.5]})"}),
              HasSubstr("bad.jsonl:1: input_ids[1] is 2.5, expected an integer"));
}

TEST_F(JsonlTest, BadJsonLine) {
  const std::string e = error_for({kGood, "", R"({"input_ids": [1, 2,)"});
  EXPECT_THAT(e, HasSubstr("bad.jsonl:3: not valid JSON: "));
  EXPECT_THAT(error_for({"[1, 2]"}), HasSubstr("bad.jsonl:1: expected a JSON object, got array"));
  EXPECT_THAT(error_for({R"({"input_ids": [1], "image": []})"}), HasSubstr("bad.jsonl:1: unknown field \"image\""));
  EXPECT_THAT(error_for({R"({"loss_mask": [1]})"}), HasSubstr("bad.jsonl:1: input_ids is missing"));
}

TEST_F(JsonlTest, WrongLossMask) {
  EXPECT_THAT(error_for({kGood, R"({"input_ids": [1, 5, 9, 2], "loss_mask": [0, 1, 1]})"}),
              HasSubstr("bad.jsonl:2: loss_mask has 3 entries but input_ids has 4"));
  EXPECT_THAT(error_for({R"({"input_ids": [1, 5, 9, 2], "loss_mask": [0, 1, 2, 1]})"}),
              HasSubstr("bad.jsonl:1: loss_mask[2] = 2, expected 0 or 1"));
}

TEST_F(JsonlTest, GridsAndSizes) {
  // 70 x 50 px without a grid: not a multiple of 28
  EXPECT_THAT(error_for({R"({"input_ids": [1, 151652, 151655, 151653, 2], "images": [{"path": "square.png"}]})"}),
              HasSubstr("bad.jsonl:1: image 0 \"" + (dir_ / "square.png").string() +
                        "\" is 70 x 50 pixels (W x H), not a multiple of patch_size * spatial_merge_size = 28"));
  EXPECT_THAT(error_for({R"({"input_ids": [1, 2], "image_grid_thw": [[1, 4, 4]]})"}),
              HasSubstr("bad.jsonl:1: image_grid_thw has 1 entries but there is no images list"));
  EXPECT_THAT(error_for({R"({"input_ids": [1, 2], "images": [{"path": "circle.png"}], "image_grid_thw": []})"}),
              HasSubstr("bad.jsonl:1: image_grid_thw has 0 entries but images has 1"));
  EXPECT_THAT(
      error_for({R"({"input_ids": [1, 2], "images": [{"path": "circle.png"}], "image_grid_thw": [[2, 4, 4]]})"}),
      HasSubstr("image_grid_thw[0] = [2, 4, 4] has t = 2 but image 0 has 1 frame(s)"));
  // frames of one video must share a size when the grid comes from the files
  EXPECT_THAT(error_for({R"({"input_ids": [1, 2], "videos": [{"frames": ["circle.png", "triangle.png"]}]})"}),
              HasSubstr("bad.jsonl:1: video 0 frame 1"));
  // LLaVA: no videos; images resized to 56 px whatever their size
  const std::string path = write({R"({"input_ids": [1, 2], "videos": [{"frames": ["circle.png"]}]})"}, "v.jsonl");
  EXPECT_THAT(error_of([&] { JsonlDataset d(path, tiny_config("tiny-llava")); }),
              HasSubstr("v.jsonl:1: videos are not supported by llava"));
  std::string llava_ids = R"({"input_ids": [1)";
  for (int i = 0; i < 16; ++i) llava_ids += ", 32000";
  const std::string ok = write({llava_ids + R"(, 2], "images": [{"path": "square.png"}]})"}, "llava.jsonl");
  const JsonlDataset llava(ok, tiny_config("tiny-llava"));
  EXPECT_EQ(llava.sequence(0).image_grid_thw[0], (plan::Grid{1, 4, 4}));
  EXPECT_EQ(llava.image_pixels(0, 0).sizes(), (std::vector<int64_t>{3, 56, 56}));
}

// InternVL: the tile count comes from the file's size (the processor's dynamic tiling),
// the placeholders must match it, a given grid must agree, and the pixels are the tiles.
TEST_F(JsonlTest, InternVLTilesFromTheFileSize) {
  const model::ModelConfig c = tiny_config("tiny-internvl");
  auto line = [](int rows, const std::string& extra) {
    std::string s = R"({"input_ids": [1, 151665)";
    for (int i = 0; i < rows; ++i) s += ", 151667";
    return s + R"(, 151666, 2], "images": [{"path": "square.png"}])" + extra + "}";
  };
  // square.png is 70 x 50 (W x H): 1.4 is closest to a 4 x 3 grid of 56 px tiles (4/3),
  // and a thumbnail follows: 13 tiles of 4 rows.
  const JsonlDataset d(write({line(52, "")}, "i.jsonl"), c);
  EXPECT_EQ(d.sequence(0).image_grid_thw[0], (plan::Grid{13, 4, 4}));
  const at::Tensor px = d.image_pixels(0, 0);
  EXPECT_EQ(px.sizes(), (std::vector<int64_t>{13, 3, 56, 56}));
  EXPECT_GT(px.std().item<double>(), 0.1);  // the drawn square, not a blank
  EXPECT_THAT(error_of([&] { JsonlDataset bad(write({line(48, "")}, "n.jsonl"), c); }),
              HasSubstr("n.jsonl:1: sequence 0: image 0 has 48 placeholder tokens but grid [13, 4, 4]"));
  EXPECT_THAT(
      error_of([&] { JsonlDataset bad(write({line(48, R"(, "image_grid_thw": [[12, 4, 4]])")}, "g.jsonl"), c); }),
      HasSubstr("g.jsonl:1: image_grid_thw[0] = [12, 4, 4] but internvl cuts image 0 (70 x 50 pixels) into "
                "13 tiles of 56 px: grid [13, 4, 4]"));
}

// Mutants of every line of the shipped example, one line mutated at a time: each file
// loads or ends in an error naming the line; never another exception, a signal or a hang.
TEST_F(JsonlTest, MutatedLinesEndInADatasetOrAnError) {
  std::ifstream in(source_path(kExample));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_GE(lines.size(), 3u);
  for (const char* png : {"move_0.png", "move_1.png", "move_2.png"})  // the video's frames
    fs::copy_file(source_path("examples/data/") + png, dir_ / png);
  const model::ModelConfig config = tiny_config("tiny-qwen2-vl");
  ASSERT_EQ(JsonlDataset(write(lines, "mutant.jsonl"), config).size(), static_cast<int64_t>(lines.size()));
  int mutants = 0, loaded = 0, refused = 0;
  double seconds = 0;
  for (size_t l = 0; l < lines.size(); ++l) {
    const test::MutantReport r = test::check_mutants(lines[l], 100 + l, 400 / static_cast<int>(lines.size()) + 1,
                                                     [&](const std::string& mutant) {
                                                       std::vector<std::string> file = lines;
                                                       file[l] = mutant;
                                                       JsonlDataset d(write(file, "mutant.jsonl"), config);
                                                     });
    mutants += r.mutants, loaded += r.accepted, refused += r.refused, seconds += r.seconds;
    EXPECT_TRUE(r.failures.empty()) << "line " << l + 1 << ": " << r.failures.size()
                                    << " failures, first: " << r.failures.front();
  }
  std::printf("JSON-lines: %d mutants, %d loaded, %d refused, %.2f s\n", mutants, loaded, refused, seconds);
  EXPECT_LT(seconds, 30.0);
}

}  // namespace
}  // namespace mmsp::train
