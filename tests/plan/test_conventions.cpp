// Model conventions from config.json: released ids per family, and clear errors.
#include <fstream>

#include <nlohmann/json.hpp>

#include "mmsp/plan/mesh.h"
#include "plan_test_util.h"

namespace mmsp::plan {
namespace {

using testing::error_of;
using ::testing::HasSubstr;

nlohmann::json load(const std::string& name) {
  std::ifstream in(std::string(MMSP_SOURCE_DIR) + "/configs/" + name);
  EXPECT_TRUE(in.good()) << name;
  return nlohmann::json::parse(in);
}

// A file read by the family of `model_type` (set where the file has none): its released
// values where the file is silent.
ModelConventions read(nlohmann::json config, const std::string& model_type) {
  if (!config.contains("model_type")) config["model_type"] = model_type;
  return model::conventions_from_config(config);
}

TEST(Conventions, Qwen2VLConfigFile) {
  const ModelConventions c = read(load("tiny-qwen2-vl.json"), "qwen2_vl");
  EXPECT_EQ(c.name, "qwen2_vl");
  EXPECT_EQ(c.vision_start_token_id, 151652);
  EXPECT_EQ(c.vision_end_token_id, 151653);
  EXPECT_EQ(c.image_token_id, 151655);
  EXPECT_EQ(c.video_token_id, 151656);
  EXPECT_EQ(c.spatial_merge_size, 2);
  EXPECT_EQ(c.mrope_section, (std::array<int64_t, 3>{2, 3, 3}));
  EXPECT_TRUE(c.uses_mrope());
  EXPECT_FALSE(c.video_frames_as_blocks());
}

TEST(Conventions, Qwen2_5VLReadsTokensPerSecond) {
  auto j = load("tiny-qwen2_5-vl.json");
  EXPECT_EQ(read(j, "qwen2_5_vl").tokens_per_second, 2.0);
  j["vision_config"]["tokens_per_second"] = 4;
  EXPECT_EQ(read(j, "qwen2_5_vl").tokens_per_second, 4.0);
}

TEST(Conventions, Qwen3VLReadsTextConfigRope) {
  const ModelConventions c = read(load("tiny-qwen3-vl.json"), "qwen3_vl");
  EXPECT_EQ(c.name, "qwen3_vl");
  EXPECT_TRUE(c.mrope_interleaved);
  EXPECT_EQ(c.mrope_section, (std::array<int64_t, 3>{2, 3, 3}));
  EXPECT_TRUE(c.video_frames_as_blocks());
  EXPECT_EQ(c.image_token_id, 151655);
}

TEST(Conventions, LlavaImageTokenIndex) {
  const ModelConventions c = read(load("tiny-llava.json"), "llava");
  EXPECT_EQ(c.image_token_id, 32000);
  EXPECT_EQ(c.spatial_merge_size, 1);
  EXPECT_FALSE(c.has_block_markers());
  EXPECT_FALSE(c.supports_video());
  EXPECT_FALSE(c.uses_mrope());
  nlohmann::json j = {{"model_type", "llava"}, {"image_token_id", 32001}};
  EXPECT_EQ(read(j, "llava").image_token_id, 32001);
  EXPECT_EQ(read(j, "llava").class_rows, 0);
  j["vision_feature_select_strategy"] = "full";  // the class token's row is kept
  EXPECT_EQ(read(j, "llava").class_rows, 1);
  j["vision_feature_select_strategy"] = "cls";
  EXPECT_THAT(error_of([&] { read(j, "llava"); }),
              HasSubstr("vision_feature_select_strategy \"cls\" is not supported"));
}

TEST(Conventions, InternVLDefaultsAndDownsample) {
  const ModelConventions c = read(load("tiny-internvl.json"), "internvl");
  EXPECT_EQ(c.image_token_id, 151667);
  EXPECT_EQ(c.vision_start_token_id, 151665);
  EXPECT_EQ(c.vision_end_token_id, 151666);
  EXPECT_EQ(c.spatial_merge_size, 2);
  nlohmann::json j = {{"model_type", "internvl"}, {"downsample_ratio", 0.3}};
  EXPECT_THAT(error_of([&] { read(j, "internvl"); }), HasSubstr("downsample_ratio 0.3"));
  // 1/k beyond any real merge (and beyond int64 for tiny ratios) is refused, not cast.
  j["downsample_ratio"] = 1e-300;
  EXPECT_THAT(error_of([&] { read(j, "internvl"); }), HasSubstr("must be 1/k for an integer k in 1..64"));
  // <img> / </img> are the tokenizer's: left out of a config whose vocabulary cannot
  // hold InternVL3's ids, there are none to look for (images are placeholder runs);
  // given, they are read (and the model layer checks them against the vocabulary).
  nlohmann::json small = {{"model_type", "internvl"}, {"image_token_id", 603}, {"text_config", {{"vocab_size", 640}}}};
  ModelConventions s = read(small, "internvl");
  EXPECT_EQ(s.vision_start_token_id, -1);
  EXPECT_EQ(s.vision_end_token_id, -1);
  EXPECT_FALSE(s.has_block_markers());
  small["image_start_token_id"] = 600;
  small["image_end_token_id"] = 601;
  s = read(small, "internvl");
  EXPECT_EQ(s.vision_start_token_id, 600);
  EXPECT_EQ(s.vision_end_token_id, 601);
}

TEST(Conventions, DefaultsWhenFieldsMissing) {
  const ModelConventions c = read({{"model_type", "qwen2_5_vl"}}, "qwen2_5_vl");
  EXPECT_EQ(c.image_token_id, 151655);
  EXPECT_EQ(c.tokens_per_second, 2.0);
  EXPECT_EQ(c.mrope_section, (std::array<int64_t, 3>{16, 24, 24}));
  EXPECT_EQ(testing::released("qwen3_vl").mrope_section, (std::array<int64_t, 3>{24, 20, 20}));
}

TEST(Conventions, Errors) {
  // model_type itself is the model layer's registry (tests/model/test_config.cpp).
  EXPECT_THAT(error_of([] {
                read({{"model_type", "qwen2_vl"}, {"image_token_id", "x"}}, "qwen2_vl");
              }),
              HasSubstr("image_token_id must be an integer"));
  EXPECT_THAT(error_of([] {
                read({{"model_type", "qwen2_vl"}, {"vision_config", {{"spatial_merge_size", 0}}}}, "qwen2_vl");
              }),
              HasSubstr("spatial_merge_size must be an integer >= 1, got 0"));
  EXPECT_THAT(error_of([] {
                read({{"model_type", "qwen2_vl"}, {"video_token_id", 151655}}, "qwen2_vl");
              }),
              HasSubstr("must differ"));
}

TEST(Mesh, CoordsUlyssesFastest) {
  const Mesh mesh{2, 3, 2};
  EXPECT_EQ(mesh.world(), 12);
  const RankCoords c = rank_coords(mesh, 7);  // 7 = (1*3 + 0)*2 + 1
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.ring, 0);
  EXPECT_EQ(c.ulysses, 1);
  for (int r = 0; r < mesh.world(); ++r) EXPECT_EQ(global_rank(mesh, rank_coords(mesh, r)), r);
}

TEST(Mesh, Errors) {
  EXPECT_THAT(error_of([] {
                validate_mesh({2, 2, 2}, 6);
              }),
              HasSubstr("world size 6 is not dp(2) × ring(2) × ulysses(2) = 8"));
  EXPECT_THAT(error_of([] { validate_mesh({1, 0, 1}); }), HasSubstr("ring(0)"));
  EXPECT_THAT(error_of([] { rank_coords({1, 2, 2}, 4); }), HasSubstr("rank 4 is outside the world of 4 ranks"));
  EXPECT_THAT(error_of([] { parse_layout("ring"); }), HasSubstr("layout \"ring\" is unknown"));
}

}  // namespace
}  // namespace mmsp::plan
