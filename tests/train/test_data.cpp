// The built-in data: word tokenizer, the processor's patch layout (against the Hugging
// Face formula written out as loops), and the shapes dataset (deterministic, parseable
// by the planner for every family, balanced captions, pixels that show the caption).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "mmsp/model/families/qwen_vl/qwen_patches.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/family.h"
#include "mmsp/plan/sequence.h"
#include "mmsp/train/data/shapes_dataset.h"
#include "mmsp/train/data/word_tokenizer.h"

namespace mmsp::train {
namespace {

using model::PixelNorm;
using model::qwen_patches;
using model::QwenPatches;
using testing::error_of;
using ::testing::HasSubstr;
using testing::tiny_config;

// ---- word tokenizer ----

TEST(WordTokenizer, RoundTrip) {
  const WordTokenizer tok(tiny_config("tiny-qwen2-vl"));
  const std::string text = "a big red circle on the left and a small white cross moves down";
  const std::vector<int64_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), 14u);
  EXPECT_EQ(ids[0], tok.id("a"));
  EXPECT_EQ(tok.decode(ids), text);
  for (int64_t id : ids) EXPECT_LT(id, tok.size());
  EXPECT_EQ(tok.id("<pad>"), WordTokenizer::kPad);
  EXPECT_EQ(tok.id("<bos>"), WordTokenizer::kBos);
  EXPECT_EQ(tok.id("<eos>"), WordTokenizer::kEos);
  // vision tokens of the model decode by name
  EXPECT_EQ(tok.decode({1, 151652, 151655, 151653, 151652, 151656, 151653, 2}),
            "<bos> <|vision_start|> <|image_pad|> <|vision_end|> <|vision_start|> <|video_pad|> "
            "<|vision_end|> <eos>");
  EXPECT_EQ(WordTokenizer(tiny_config("tiny-llava")).decode({1, 32000, 2}), "<bos> <image> <eos>");
}

TEST(WordTokenizer, Errors) {
  const WordTokenizer tok(tiny_config("tiny-qwen2-vl"));
  EXPECT_THAT(error_of([&] { tok.encode("a big purple circle"); }),
              HasSubstr("unknown word \"purple\" at word 2 of \"a big purple circle\""));
  EXPECT_THAT(error_of([&] { tok.decode({3, 151000}); }), HasSubstr("cannot decode id 151000 at position 1"));
}

nlohmann::json small_vocab_config(int64_t vocab, int64_t first_special) {
  nlohmann::json c = nlohmann::json::parse(R"({"model_type": "qwen2_vl", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
      "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
      "vision_config": {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2,
                        "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}})");
  c["vocab_size"] = vocab;
  c["vision_start_token_id"] = first_special;
  c["vision_end_token_id"] = first_special + 1;
  c["image_token_id"] = first_special + 2;
  c["video_token_id"] = first_special + 3;
  return c;
}

TEST(WordTokenizer, ChecksTheModelsIds) {
  const int64_t words = static_cast<int64_t>(WordTokenizer::vocabulary().size());
  EXPECT_NO_THROW(WordTokenizer(model::parse_model_config(small_vocab_config(words + 4, words))));
  // the vocabulary does not fit
  const auto small = model::parse_model_config(small_vocab_config(20, 16));
  EXPECT_THAT(
      error_of([&] { WordTokenizer t(small); }),
      HasSubstr("word \"" + WordTokenizer::vocabulary()[20] + "\" has id 20 but the model's text vocab_size is 20"));
  // a word id that the model uses for a vision token
  const auto clash = model::parse_model_config(small_vocab_config(100, 13));
  EXPECT_THAT(error_of([&] { WordTokenizer t(clash); }),
              HasSubstr("word \"circle\" has id 13, which the model uses as its vision_start_token_id"));
}

// ---- patchify ----

model::QwenVisionConfig small_vision(int64_t p, int64_t m, int64_t tp) {
  model::QwenVisionConfig v;
  v.patch_size = p, v.spatial_merge_size = m, v.temporal_patch_size = tp, v.in_channels = 3;
  return v;
}

// Hugging Face's Qwen2VLImageProcessor._preprocess written out element by element:
// patches.reshape(gt, tp, C, gh/m, m, p, gw/m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
// after padding the frames to a multiple of tp with the last frame.
at::Tensor reference_patches(const at::Tensor& frames, const model::QwenVisionConfig& v, const PixelNorm& n) {
  const int64_t T = frames.size(0), C = frames.size(1), H = frames.size(2), W = frames.size(3);
  const int64_t p = v.patch_size, m = v.spatial_merge_size, tp = v.temporal_patch_size;
  const int64_t gt = (T + tp - 1) / tp, gh = H / p, gw = W / p;
  at::Tensor out = at::empty({gt * gh * gw, C * tp * p * p}, at::kFloat);
  auto f = frames.accessor<float, 4>();
  auto o = out.accessor<float, 2>();
  for (int64_t t = 0; t < gt; ++t)
    for (int64_t bh = 0; bh < gh / m; ++bh)
      for (int64_t bw = 0; bw < gw / m; ++bw)
        for (int64_t mh = 0; mh < m; ++mh)
          for (int64_t mw = 0; mw < m; ++mw) {
            const int64_t row = (((t * (gh / m) + bh) * (gw / m) + bw) * m + mh) * m + mw;
            for (int64_t c = 0; c < C; ++c)
              for (int64_t ti = 0; ti < tp; ++ti)
                for (int64_t py = 0; py < p; ++py)
                  for (int64_t px = 0; px < p; ++px) {
                    const int64_t frame = std::min(t * tp + ti, T - 1);
                    const int64_t y = (bh * m + mh) * p + py, x = (bw * m + mw) * p + px;
                    const float mean = static_cast<float>(n.mean[c]), std = static_cast<float>(n.std[c]);
                    o[row][((c * tp + ti) * p + py) * p + px] = (f[frame][c][y][x] - mean) / std;
                  }
          }
  return out;
}

TEST(Patchify, MatchesHuggingFaceOrder) {
  const model::QwenVisionConfig v = small_vision(2, 2, 2);
  const PixelNorm norm;  // CLIP
  for (int64_t T : {1, 3, 4}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    at::manual_seed(T);
    const at::Tensor frames = at::rand({T, 3, 8, 12});  // H 8, W 12: grid [.., 4, 6]
    const QwenPatches got = qwen_patches(frames, v, norm);
    EXPECT_EQ(got.grid, (plan::Grid{(T + 1) / 2, 4, 6}));
    const at::Tensor want = reference_patches(frames, v, norm);
    ASSERT_EQ(got.rows.sizes(), want.sizes());
    EXPECT_TRUE(at::allclose(got.rows, want, 1e-6, 1e-6)) << (got.rows - want).abs().max().item<float>();
  }
  // an image is repeated over time: both temporal halves of every row are equal
  const at::Tensor image = at::rand({1, 3, 8, 12});
  const at::Tensor rows = qwen_patches(image, v, norm).rows.view({-1, 3, 2, 4});
  EXPECT_TRUE(at::equal(rows.select(2, 0), rows.select(2, 1)));
  // merge 1, temporal 1
  const model::QwenVisionConfig v1 = small_vision(4, 1, 1);
  const at::Tensor frames = at::rand({2, 3, 8, 4});
  EXPECT_TRUE(at::allclose(qwen_patches(frames, v1, norm).rows, reference_patches(frames, v1, norm)));
}

TEST(Patchify, Normalisation) {
  // each family's processor values, from its registry entry
  auto norm = [](const char* name) { return model::pixel_geometry(tiny_config(name))->norm(); };
  EXPECT_DOUBLE_EQ(norm("tiny-qwen2-vl").mean[0], 0.48145466);
  EXPECT_DOUBLE_EQ(norm("tiny-llava").std[2], 0.27577711);
  EXPECT_DOUBLE_EQ(norm("tiny-qwen3-vl").mean[1], 0.5);
  const at::Tensor white = at::ones({3, 2, 2});
  const at::Tensor n = model::normalize_pixels(white, 0, PixelNorm{});
  EXPECT_NEAR(n[0][0][0].item<float>(), (1 - 0.48145466) / 0.26862954, 1e-6);
}

TEST(Patchify, Errors) {
  const model::QwenVisionConfig v = small_vision(2, 2, 2);
  EXPECT_THAT(error_of([&] {
                qwen_patches(at::rand({1, 3, 6, 8}), v, {});
              }),
              HasSubstr("frame size 6 x 8 (H x W) must be a positive multiple of patch_size * "
                        "spatial_merge_size = 4"));
  EXPECT_THAT(error_of([&] {
                qwen_patches(at::rand({1, 4, 8, 8}), v, {});
              }),
              HasSubstr("have 4 channels but vision_config.in_channels is 3"));
  EXPECT_THAT(error_of([&] { qwen_patches(at::rand({3, 8, 8}), v, {}); }), HasSubstr("must be [T, C, H, W]"));
}

// ---- shapes dataset ----

ShapesOptions options(uint64_t seed = 7) {
  ShapesOptions o;
  o.samples = 400;
  o.seed = seed;
  return o;
}

TEST(Shapes, DeterministicPerIndex) {
  const auto config = tiny_config("tiny-qwen2-vl");
  const ShapesDataset a(options(), config), b(options(), config), c(options(8), config);
  // asked in another order, by another object: the same sample
  const plan::Sequence late = b.sequence(123);
  for (int64_t i : {5, 123, 399}) {
    EXPECT_EQ(a.sequence(i).input_ids, b.sequence(i).input_ids);
    EXPECT_EQ(a.sequence(i).image_grid_thw, b.sequence(i).image_grid_thw);
    EXPECT_TRUE(at::equal(a.image_pixels(i, 0), b.image_pixels(i, 0)) || a.sequence(i).image_grid_thw.empty());
  }
  EXPECT_EQ(a.sequence(123).input_ids, late.input_ids);
  int differ = 0;
  for (int64_t i = 0; i < 20; ++i) differ += a.caption(i) != c.caption(i);
  EXPECT_GE(differ, 15) << "another seed draws other samples";
  EXPECT_THAT(error_of([&] { a.sequence(400); }), HasSubstr("sample index 400 is outside 0..399"));
  EXPECT_THAT(error_of([&] { a.image_pixels(0, 9); }), HasSubstr("no image 9"));
  EXPECT_THAT(a.describe(), HasSubstr("shapes: 400 samples per epoch, seed 7, qwen2_vl"));
}

// max_sequence_tokens bounds every sample (a soak of the defaults, 2 ranks of 64 tokens, met
// a 133-token sample no row held at its 32,073rd); the samples that fit are the unbounded ones.
TEST(Shapes, SamplesFitTheRowTheyAreBoundedBy) {
  for (const char* family : {"tiny-qwen2-vl", "tiny-qwen3-vl", "tiny-llava"}) {
    SCOPED_TRACE(family);
    const auto config = tiny_config(family);
    ShapesOptions bounded_options = options();
    bounded_options.samples = 4000;
    ShapesOptions unbounded_options = bounded_options;
    bounded_options.max_sequence_tokens = 64;
    const ShapesDataset bounded(bounded_options, config), unbounded(unbounded_options, config);
    int64_t trimmed = 0;
    for (int64_t i = 0; i < bounded.size(); ++i) {
      const plan::Sequence b = bounded.sequence(i), u = unbounded.sequence(i);
      ASSERT_LE(b.input_ids.size(), 64u) << "sample " << i;
      if (u.input_ids.size() <= 64) {
        ASSERT_EQ(b.input_ids, u.input_ids) << "sample " << i << " fits: drawn as without a bound";
        ASSERT_EQ(bounded.caption(i), unbounded.caption(i));
      } else {
        ++trimmed;
        plan::parse_sequence(b, config.conventions, i);  // still a well-formed sample
        ASSERT_EQ(b.image_grid_thw.size() + b.video_grid_thw.size(), bounded.items(i).size());
      }
    }
    EXPECT_GT(trimmed, 0) << "the bound is met at 64 tokens: the test checks something";
  }
}

// Every sample parses through the planner; loss_mask is 1 exactly on the caption and <eos>.
void check_family(const std::string& name, bool videos) {
  SCOPED_TRACE(name);
  const auto config = tiny_config(name);
  const ShapesDataset data(options(), config);
  int64_t video_samples = 0, multi = 0;
  for (int64_t i = 0; i < data.size(); ++i) {
    const plan::Sequence s = data.sequence(i);
    const plan::ParsedSequence parsed = plan::parse_sequence(s, config.conventions, i);
    const auto items = data.items(i);
    ASSERT_EQ(s.image_grid_thw.size() + s.video_grid_thw.size(), items.size());
    video_samples += !s.video_grid_thw.empty();
    multi += items.size() > 1;
    // targets: the caption words and <eos>, nothing else
    std::vector<int64_t> targets;
    for (size_t k = 0; k < s.input_ids.size(); ++k)
      if (s.loss_mask[k]) targets.push_back(s.input_ids[k]);
    ASSERT_EQ(data.tokenizer().decode(targets), data.caption(i) + " <eos>") << i;
    EXPECT_EQ(s.input_ids.front(), WordTokenizer::kBos);
    EXPECT_EQ(
        static_cast<int64_t>(s.input_ids.size()) - static_cast<int64_t>(targets.size()),
        parsed.blocks.back().start + parsed.blocks.back().size() + (config.conventions.has_block_markers() ? 1 : 0))
        << "the prompt ends with the last vision block";
  }
  EXPECT_GT(multi, 40);
  if (videos)
    EXPECT_GT(video_samples, 40);
  else
    EXPECT_EQ(video_samples, 0);
}

TEST(Shapes, ParsesForQwen2VL) { check_family("tiny-qwen2-vl", true); }
TEST(Shapes, ParsesForQwen3VL) { check_family("tiny-qwen3-vl", true); }
TEST(Shapes, ParsesForLlava) { check_family("tiny-llava", false); }

TEST(Shapes, Qwen3VideoFramesAreBlocksAfterTimestamps) {
  const auto config = tiny_config("tiny-qwen3-vl");
  const ShapesDataset data(options(), config);
  for (int64_t i = 0; i < data.size(); ++i) {
    const plan::Sequence s = data.sequence(i);
    if (s.video_grid_thw.empty() || s.video_grid_thw[0][0] < 2) continue;
    const std::string text = data.tokenizer().decode(s.input_ids);
    EXPECT_THAT(text, ::testing::StartsWith("<bos> <0.0 seconds> <|vision_start|> <|video_pad|>"));
    EXPECT_THAT(text, HasSubstr("<|vision_end|> <1.0 seconds> <|vision_start|>"));
    return;
  }
  FAIL() << "no video of two temporal patches in 400 samples";
}

TEST(Shapes, CaptionAttributesCoverTheirValues) {
  ShapesOptions o = options();
  o.samples = 2000;  // about 100 of each of the 24 colour-shape pairs
  const ShapesDataset data(o, tiny_config("tiny-qwen2-vl"));
  std::map<std::string, std::map<std::string, int>> seen;
  for (int64_t i = 0; i < data.size(); ++i)
    for (const ShapesItem& it : data.items(i)) {
      ++seen["size"][it.size], ++seen["colour"][it.colour], ++seen["shape"][it.shape];
      ++seen[it.video ? "direction" : "place"][it.place];
      // the colour says nothing about the shape and vice versa (independent draws)
      ++seen["colour+shape"][it.colour + " " + it.shape];
    }
  const std::map<std::string, size_t> values = {{"size", 2},  {"colour", 6},    {"shape", 4},
                                                {"place", 5}, {"direction", 4}, {"colour+shape", 24}};
  for (const auto& [attribute, count] : values) {
    SCOPED_TRACE(attribute);
    ASSERT_EQ(seen[attribute].size(), count);
    int total = 0;
    for (const auto& [v, n] : seen[attribute]) total += n;
    for (const auto& [v, n] : seen[attribute])  // roughly uniform: within half of the mean
      EXPECT_GT(n, total / static_cast<int>(count) / 2) << v;
  }
}

// Mask of shape pixels of a rendered frame [3, H, W]: the background is grey <= 0.25.
at::Tensor shape_mask(const at::Tensor& frame) { return std::get<0>(frame.max(0)) > 0.5; }

double centroid(const at::Tensor& mask, int dim) {  // 0: y, 1: x, as a fraction of the side
  const at::Tensor idx = at::nonzero(mask).select(1, dim).to(at::kDouble) + 0.5;
  return idx.mean().item<double>() / mask.size(dim);
}

TEST(Shapes, PixelsShowTheCaption) {
  const ShapesDataset data(options(), tiny_config("tiny-qwen2-vl"));
  int checked = 0;
  for (int64_t i = 0; i < 100; ++i) {
    const auto items = data.items(i);
    for (size_t k = 0; k < items.size(); ++k) {
      const ShapesItem& it = items[k];
      const at::Tensor frames = data.render(i, static_cast<int64_t>(k));
      ASSERT_EQ(frames.sizes(), (std::vector<int64_t>{it.frames, 3, it.height, it.width}));
      const at::Tensor first = shape_mask(frames[0]), last = shape_mask(frames[it.frames - 1]);
      ASSERT_GT(first.sum().item<int64_t>(), 0) << data.caption(i);
      if (it.video) {
        const double dx = centroid(last, 1) - centroid(first, 1), dy = centroid(last, 0) - centroid(first, 0);
        if (it.place == "right") { EXPECT_GT(dx, 0.2); }
        if (it.place == "left") { EXPECT_LT(dx, -0.2); }
        if (it.place == "down") { EXPECT_GT(dy, 0.2); }
        if (it.place == "up") { EXPECT_LT(dy, -0.2); }
      } else {
        const double x = centroid(first, 1), y = centroid(first, 0);
        if (it.place == "left") { EXPECT_LT(x, 0.35) << data.caption(i); }
        if (it.place == "right") { EXPECT_GT(x, 0.65) << data.caption(i); }
        if (it.place == "top") { EXPECT_LT(y, 0.4) << data.caption(i); }
        if (it.place == "bottom") { EXPECT_GT(y, 0.6) << data.caption(i); }
        if (it.place == "centre") {
          EXPECT_NEAR(x, 0.5, 0.1);
          EXPECT_NEAR(y, 0.5, 0.1);
        }
      }
      // the shape's colour is the caption's: red has R high, G and B low
      const at::Tensor mean_rgb = frames[0].masked_select(first.expand({3, it.height, it.width})).view({3, -1}).mean(1);
      if (it.colour == "red") { EXPECT_TRUE(mean_rgb[0].item<float>() > 0.9 && mean_rgb[1].item<float>() < 0.1); }
      if (it.colour == "blue") { EXPECT_TRUE(mean_rgb[2].item<float>() > 0.9 && mean_rgb[0].item<float>() < 0.1); }
      // a big shape covers more than a small one could
      const double area = first.sum().item<double>() /
                          static_cast<double>(std::min(it.height, it.width) * std::min(it.height, it.width));
      if (it.size == "big") { EXPECT_GT(area, 0.08); }
      if (it.size == "small") { EXPECT_LT(area, 0.06); }
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(Shapes, PixelRowsMatchTheGrid) {
  for (const std::string name : {"tiny-qwen2-vl", "tiny-qwen3-vl"}) {
    SCOPED_TRACE(name);
    const auto config = tiny_config(name);
    const auto& v = *qwen_vision_of(config);
    const int64_t width = 3 * v.temporal_patch_size * v.patch_size * v.patch_size;
    const ShapesDataset data(options(), config);
    for (int64_t i = 0; i < 30; ++i) {
      const plan::Sequence s = data.sequence(i);
      for (size_t k = 0; k < s.image_grid_thw.size(); ++k) {
        const plan::Grid& g = s.image_grid_thw[k];
        EXPECT_EQ(g[0], 1);
        EXPECT_EQ(data.image_pixels(i, k).sizes(), (std::vector<int64_t>{g[0] * g[1] * g[2], width}));
      }
      for (size_t k = 0; k < s.video_grid_thw.size(); ++k) {
        const plan::Grid& g = s.video_grid_thw[k];
        EXPECT_EQ(data.video_pixels(i, k).sizes(), (std::vector<int64_t>{g[0] * g[1] * g[2], width}));
        EXPECT_EQ(data.video_pixels(i, k).scalar_type(), at::kFloat);
      }
    }
  }
  const auto llava = tiny_config("tiny-llava");
  const ShapesDataset data(options(), llava);
  EXPECT_EQ(data.image_pixels(0, 0).sizes(), (std::vector<int64_t>{3, 56, 56}));
  EXPECT_EQ(data.sequence(0).image_grid_thw[0], (plan::Grid{1, 4, 4}));
}

TEST(Shapes, BlankImagesAreConstant) {
  for (const std::string name : {"tiny-qwen2-vl", "tiny-qwen3-vl", "tiny-llava"}) {
    SCOPED_TRACE(name);
    const auto config = tiny_config(name);
    ShapesOptions o = options();
    o.blank_images = true;
    const ShapesDataset blank(o, config), drawn(options(), config);
    for (int64_t i = 0; i < 20; ++i) {
      const plan::Sequence s = blank.sequence(i);
      EXPECT_EQ(s.input_ids, drawn.sequence(i).input_ids) << "blanking keeps the captions";
      for (size_t k = 0; k < s.image_grid_thw.size(); ++k) {
        const at::Tensor px = blank.image_pixels(i, k);
        EXPECT_EQ(px.abs().max().item<float>(), 0.0f) << "the per-channel mean normalises to 0";
        EXPECT_GT(drawn.image_pixels(i, k).abs().max().item<float>(), 0.5f);
      }
      for (size_t k = 0; k < s.video_grid_thw.size(); ++k)
        EXPECT_EQ(blank.video_pixels(i, k).abs().max().item<float>(), 0.0f);
    }
    EXPECT_THAT(blank.describe(), HasSubstr("images blanked"));
  }
}

TEST(Shapes, OptionErrors) {
  const auto config = tiny_config("tiny-qwen2-vl");
  ShapesOptions o = options();
  o.max_tokens_per_side = 1;
  EXPECT_THAT(error_of([&] { ShapesDataset d(o, config); }),
              HasSubstr("tokens per side range [2, 1] must satisfy 1 <= min <= max"));
  o = options();
  o.video_fraction = 0.9;
  EXPECT_THAT(error_of([&] { ShapesDataset d(o, config); }),
              HasSubstr("multi_image_fraction (0.2) and video_fraction (0.9) must be >= 0 and sum to at most 1"));
  o = options();
  o.max_frames = 21;
  EXPECT_THAT(error_of([&] { ShapesDataset d(o, config); }), HasSubstr("max_frames 21"));
}

}  // namespace
}  // namespace mmsp::train
