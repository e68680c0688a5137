// LLaVA under sequence parallelism equals one process: four images in four packed
// sequences (the tower's class token dropped or kept), planned for every mesh of the
// world; in each vision mode the loss and every parameter gradient, summed over ranks,
// equal the single-process run (fp64 1e-9; fp32 1e-4); adaptive placement and images
// split over the context group likewise.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <set>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/hf/safetensors.h"
#include "mmsp/model/checkpoint_naming.h"
#include "mmsp/model/family.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/parallel/step_parallelism.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "multirank.h"
#include "vlm_step.h"

using namespace mmsp;
using at::Tensor;

namespace {

using test::adaptive_options, test::kAdaptiveBalances, test::run_model, test::whole_and_split;
using test::kImage, test::text;
using Result = test::StepResult;

}  // namespace

namespace {

// strategy "default" drops the vision tower's class token (16 rows per image), "full"
// keeps it (17 rows).
nlohmann::json tiny_llava_json(const std::string& strategy = "default") {
  return {{"model_type", "llava"},
          {"image_token_index", kImage},
          {"image_seq_length", strategy == "full" ? 17 : 16},
          {"projector_hidden_act", "gelu"},
          {"vision_feature_layer", -2},
          {"vision_feature_select_strategy", strategy},
          {"tie_word_embeddings", false},
          {"text_config",
           {{"model_type", "llama"},
            {"vocab_size", 128},
            {"hidden_size", 96},
            {"intermediate_size", 64},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 12},
            {"num_key_value_heads", 2},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0}}},
          {"vision_config",
           {{"model_type", "clip_vision_model"},
            {"hidden_size", 16},
            {"intermediate_size", 32},
            {"num_hidden_layers", 3},
            {"num_attention_heads", 2},
            {"image_size", 8},
            {"patch_size", 2},
            {"projection_dim", 16},
            {"hidden_act", "quick_gelu"},
            {"layer_norm_eps", 1e-5}}}};
}

model::ModelConfig tiny_llava(const std::string& strategy = "default") {
  return model::parse_model_config(tiny_llava_json(strategy), "tiny llava");
}

// Four images of `rows` placeholder tokens (bare runs of <image>) in four sequences;
// sequence b holds two adjacent-but-separate images.
plan::Batch llava_batch(int rows = 16) {
  plan::Sequence a, b, c, d;
  auto image = [rows](plan::Sequence& s) {
    for (int i = 0; i < rows; ++i) s.input_ids.push_back(kImage);
    s.image_grid_thw.push_back({1, 4, 4});
  };
  text(a, 2, 1), image(a), text(a, 7, 2);
  text(b, 4, 3), image(b), text(b, 2, 4), image(b), text(b, 3, 5);
  text(c, 11, 6);
  text(d, 5, 7), image(d);
  return {{a, b, c, d}};
}

Result run_llava(const model::ModelConfig& config, const plan::Batch& batch, const plan::StepPlan& plan,
                 const parallel::StepGroups& groups, const dist::GroupPtr& world, model::VisionMode mode,
                 at::ScalarType dtype = at::kDouble) {
  at::manual_seed(9);
  const model::PixelInputs pixels{at::randn({4, 3, 8, 8}, dtype), {}};
  return run_model(config, batch, plan, groups, world, mode, pixels, dtype);
}

}  // namespace

class LlavaDtype : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(LlavaDtype, MultiRankEqualsOneProcessInEveryVisionMode) {
  const at::ScalarType dtype = GetParam();
  const double rtol = dtype == at::kDouble ? 1e-9 : 1e-4;
  for (const std::string strategy : {"default", "full"}) {
    const model::ModelConfig config = tiny_llava(strategy);
    const plan::Batch batch = llava_batch(strategy == "full" ? 17 : 16);
    const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
    const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
    const Result ref = run_llava(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed, dtype);
    for (const auto& [name, g] : ref.grads)
      if (name.find("vision_tower") != std::string::npos && name.find("layers.0.") != std::string::npos) {
        EXPECT_GT(g.abs().max().item<double>(), 0) << name << " gets no gradient";
      }
    for (const dist::Mesh& mesh : test::all_meshes()) {
      if (mesh.shape().ulysses == 3) continue;
      plan::PlanOptions options;
      options.mesh = mesh.shape();
      const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
      for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
        const Result got =
            run_llava(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world(), mode, dtype);
        test::expect_same_step(got, ref, rtol,
                               mesh.shape().str() + " " + model::to_string(mode) + " " +
                                   (dtype == at::kDouble ? "fp64 " : "fp32 ") + strategy);
      }
    }
  }
}

// Vision-tower SP for CLIP: each image (17 tokens: the class token and 16 patches) split
// over the context group, its class token on rank 0 alone — attended by every rank's
// patches through the exchange, dropped once ("default") or routed once as the image's
// first row ("full") — with 12 heads (48 wide) over 2, 3 or 4 ranks; the four images at
// once, so the gathered tokens are put image by image. Every mesh and vision mode: the
// loss and every gradient equal one process's (fp64 1e-9).
TEST(MultiRankLlava, SplitImagesEqualOneProcess) {
  for (const std::string strategy : {"default", "full"}) {
    nlohmann::json c = tiny_llava_json(strategy);
    c["vision_config"]["hidden_size"] = 48;
    c["vision_config"]["num_attention_heads"] = 12;
    const model::ModelConfig config = model::parse_model_config(c, "tiny llava with 12 vision heads");
    const plan::Batch batch = llava_batch(strategy == "full" ? 17 : 16);
    const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
    const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
    const Result ref = run_llava(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed);
    for (const dist::Mesh& mesh : test::all_meshes()) {
      if (mesh.shape().ulysses == 3) continue;  // the decoder's 2 K/V heads
      plan::PlanOptions options;
      options.mesh = mesh.shape();
      options.vision_split = plan::parse_vision_split("16");
      const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
      for (const plan::RowPlan& row : mine.rows)
        for (const plan::VisionItem& it : row.items) EXPECT_EQ(it.split(), mesh.shape().context() > 1);
      for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
        const Result got =
            run_llava(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world(), mode);
        test::expect_same_step(got, ref, 1e-9,
                               mesh.shape().str() + " split " + strategy + " " + model::to_string(mode));
      }
    }
  }
}

TEST(MultiRankLlava, AdaptivePlacementEqualsOneProcess) {
  const model::ModelConfig config = tiny_llava();
  const plan::Batch batch = llava_batch();
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const Result ref = run_llava(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;
    for (const plan::PlacementOptions& balance : kAdaptiveBalances) {
      const plan::StepPlan mine =
          plan::make_step_plan(batch, config.conventions, adaptive_options(mesh, balance), mesh.rank());
      const auto [w, sp] = whole_and_split(mine);
      const Result got = run_llava(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world(),
                                   model::VisionMode::routed);
      test::expect_same_step(
          got, ref, 1e-9,
          mesh.shape().str() + " adaptive " + std::to_string(w) + " whole " + std::to_string(sp) + " split");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MultiRank, LlavaDtype, ::testing::Values(at::kDouble, at::kFloat),
                         [](const auto& info) { return info.param == at::kDouble ? "fp64" : "fp32"; });

// transformers' LlavaModel.get_image_features: the chosen hidden state, with its first
// row (the class token) dropped under "default" and kept under "full", then the
// projector. With the same weights, each image's "full" rows are therefore its class
// token's row followed by exactly the "default" rows.
TEST(LlavaFull, ClassTokenRowThenTheDefaultRows) {
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  auto rows_of = [&](const std::string& strategy, int rows) {
    const model::ModelConfig config = tiny_llava(strategy);
    const plan::Batch batch = llava_batch(rows);
    const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, {}, 0);
    at::manual_seed(5);
    auto llava = model::build_vlm(config);
    llava->to(at::kDouble);
    at::manual_seed(9);
    const model::PixelInputs pixels{at::randn({4, 3, 8, 8}, at::kDouble), {}};
    return llava->vision_rows(plan, pixels, parallel::vision_router(plan, solo, model::VisionMode::routed)).detach();
  };
  const at::Tensor def = rows_of("default", 16), full = rows_of("full", 17);
  ASSERT_EQ(def.size(0), 4 * 16);
  ASSERT_EQ(full.size(0), 4 * 17);
  for (int64_t image = 0; image < 4; ++image)
    EXPECT_TRUE(at::allclose(full.narrow(0, image * 17 + 1, 16), def.narrow(0, image * 16, 16), 1e-12, 0))
        << "image " << image;
  // and the class token's row is a row of its own
  EXPECT_FALSE(at::allclose(full[0], full[1]));
}

TEST(LlavaNames, AreTheCheckpointNames) {
  auto llava = model::build_vlm(tiny_llava());
  std::set<std::string> names;
  for (const auto& item : llava->named_parameters()) names.insert(item.key());
  for (const char* name : {"vision_tower.vision_model.embeddings.class_embedding",
                           "vision_tower.vision_model.embeddings.patch_embedding.weight",
                           "vision_tower.vision_model.embeddings.position_embedding.weight",
                           "vision_tower.vision_model.pre_layrnorm.weight",
                           "vision_tower.vision_model.encoder.layers.2.self_attn.out_proj.bias",
                           "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
                           "vision_tower.vision_model.post_layernorm.bias", "multi_modal_projector.linear_1.weight",
                           "multi_modal_projector.linear_2.bias", "language_model.model.embed_tokens.weight",
                           "language_model.model.layers.1.self_attn.q_proj.weight", "language_model.lm_head.weight"})
    EXPECT_EQ(names.count(name), 1u) << name;
  EXPECT_EQ(names.count("language_model.model.layers.1.self_attn.q_proj.bias"), 0u);  // Llama: no bias
}
