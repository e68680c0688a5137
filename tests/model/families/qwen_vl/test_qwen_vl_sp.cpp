// The Qwen2-VL, Qwen2.5-VL (windowed vision blocks) and Qwen3-VL (deepstack) models
// under sequence parallelism equal one process: a packed batch of images, a video and
// text, planned for every mesh of the world; in each vision mode (routed, gather,
// replicate) the loss and every parameter gradient (vision encoder, mergers, decoder),
// summed over ranks, equal the single-process run (fp64 1e-9; fp32 1e-4).
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
#include "mmsp/model/families/qwen_vl/qwen_variant.h"
#include "mmsp/model/family.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/parallel/step_parallelism.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "moe_step.h"
#include "multirank.h"
#include "vlm_step.h"

using namespace mmsp;
using at::Tensor;

namespace {

using test::adaptive_options, test::kAdaptiveBalances, test::run_model, test::whole_and_split;
using test::kStart, test::kEnd, test::kImage, test::kVideo, test::text, test::block;
using Result = test::StepResult;

// Qwen2-VL's top-level text fields, which Qwen2.5-VL shares.
nlohmann::json tiny_qwen2_vl_json() {
  return {{"model_type", "qwen2_vl"},
          {"vocab_size", 128},
          {"hidden_size", 96},
          {"intermediate_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 12},
          {"num_key_value_heads", 2},
          {"rope_theta", 10000.0},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false},
          {"vision_start_token_id", kStart},
          {"vision_end_token_id", kEnd},
          {"vision_token_id", 119},
          {"image_token_id", kImage},
          {"video_token_id", kVideo},
          {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}}},
          {"vision_config",
           {{"depth", 2},
            {"embed_dim", 16},
            {"hidden_size", 96},
            {"num_heads", 2},
            {"mlp_ratio", 2},
            {"patch_size", 2},
            {"spatial_merge_size", 2},
            {"temporal_patch_size", 2},
            {"in_chans", 3},
            {"hidden_act", "quick_gelu"}}}};
}

model::ModelConfig tiny_qwen2_vl() { return model::parse_model_config(tiny_qwen2_vl_json(), "tiny qwen2_vl"); }

// Qwen3-VL: nested text_config, q/k norms, interleaved mRoPE, patch-embedding bias, a
// 4 × 4 position table, deepstack from both vision blocks into decoder layers 0 and 1.
nlohmann::json tiny_qwen3_vl_json() {
  return {{"model_type", "qwen3_vl"},
          {"tie_word_embeddings", false},
          {"vision_start_token_id", kStart},
          {"vision_end_token_id", kEnd},
          {"image_token_id", kImage},
          {"video_token_id", kVideo},
          {"text_config",
           {{"model_type", "qwen3_vl_text"},
            {"vocab_size", 128},
            {"hidden_size", 96},
            {"intermediate_size", 64},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 12},
            {"num_key_value_heads", 2},
            {"head_dim", 8},
            {"attention_bias", false},
            {"rope_theta", 10000.0},
            {"rms_norm_eps", 1e-6},
            {"rope_scaling", {{"rope_type", "default"}, {"mrope_interleaved", true}, {"mrope_section", {2, 1, 1}}}}}},
          {"vision_config",
           {{"model_type", "qwen3_vl"},
            {"depth", 2},
            {"hidden_size", 16},
            {"intermediate_size", 32},
            {"num_heads", 2},
            {"in_channels", 3},
            {"patch_size", 2},
            {"temporal_patch_size", 2},
            {"spatial_merge_size", 2},
            {"out_hidden_size", 96},
            {"num_position_embeddings", 16},
            {"deepstack_visual_indexes", {0, 1}},
            {"hidden_act", "gelu_pytorch_tanh"}}}};
}

model::ModelConfig tiny_qwen3_vl() { return model::parse_model_config(tiny_qwen3_vl_json(), "tiny qwen3_vl"); }

// Qwen3-VL-MoE: Qwen3-VL with 3 decoder layers of 8 experts (top 2, renormalised) but layer
// 1's dense MLP (mlp_only_layers), and the auxiliary loss at 0.1, so that its gradient is
// far above the tolerance.
model::ModelConfig tiny_qwen3_vl_moe() {
  nlohmann::json c = tiny_qwen3_vl_json();
  c["model_type"] = "qwen3_vl_moe";
  nlohmann::json& t = c["text_config"];
  t["model_type"] = "qwen3_vl_moe_text";
  t["num_hidden_layers"] = 3;
  t["moe_intermediate_size"] = 20;
  t["num_experts"] = 8;
  t["num_experts_per_tok"] = 2;
  t["mlp_only_layers"] = {1};
  t["output_router_logits"] = true;
  t["router_aux_loss_coef"] = 0.1;
  c["vision_config"]["model_type"] = "qwen3_vl_moe";
  return model::parse_model_config(c, "tiny qwen3_vl_moe");
}

// Qwen2.5-VL: RMSNorm and gated SiLU MLP in the vision blocks, windows of 2 × 2 merged
// patches (8 px) in block 0, whole frames in block 1; video times scaled by
// second_per_grid_ts · tokens_per_second.
nlohmann::json tiny_qwen2_5_vl_json() {
  nlohmann::json c = tiny_qwen2_vl_json();
  c["model_type"] = "qwen2_5_vl";
  c["vision_config"] = {{"depth", 2},
                        {"hidden_size", 16},
                        {"intermediate_size", 24},
                        {"num_heads", 2},
                        {"out_hidden_size", 96},
                        {"patch_size", 2},
                        {"spatial_merge_size", 2},
                        {"temporal_patch_size", 2},
                        {"in_chans", 3},
                        {"hidden_act", "silu"},
                        {"window_size", 8},
                        {"fullatt_block_indexes", {1}},
                        {"tokens_per_second", 2}};
  return c;
}

model::ModelConfig tiny_qwen2_5_vl() { return model::parse_model_config(tiny_qwen2_5_vl_json(), "tiny qwen2_5_vl"); }

model::ModelConfig tiny_config(model::QwenVariant family) {
  if (family == model::QwenVariant::qwen3_vl) return tiny_qwen3_vl();
  if (family == model::QwenVariant::qwen2_5_vl) return tiny_qwen2_5_vl();
  return tiny_qwen2_vl();
}

// Qwen2.5-VL: an image of 32 rows (merged 4 × 8: two rows of four windows), more than
// a rank's share of the 114 tokens on 4 ranks; one of 15 rows (merged 3 × 5: windows
// cut short); a two-frame video 0.75 s apart (t positions 0 and 1.5 → 1), text, and a
// text-only sequence.
plan::Batch qwen2_5_batch() {
  plan::Sequence a, b, c, d;
  text(a, 3, 1), block(a, kImage, 32), text(a, 6, 2);
  a.image_grid_thw = {{1, 8, 16}};
  text(b, 5, 3), block(b, kImage, 15), text(b, 3, 4), block(b, kVideo, 12), text(b, 2, 5);
  b.image_grid_thw = {{1, 6, 10}};
  b.video_grid_thw = {{2, 4, 6}};
  b.second_per_grid_ts = {0.75};
  text(c, 9, 6);
  text(d, 21, 7);
  return {{a, b, c, d}};
}

// Two images and a video over three sequences (and a text-only one); the 16-token
// image sits where shard borders cut it on most meshes. Qwen3-VL writes each video
// frame as its own block after its timestamp text.
plan::Batch vision_batch(model::QwenVariant family = model::QwenVariant::qwen2_vl) {
  if (family == model::QwenVariant::qwen2_5_vl) return qwen2_5_batch();
  plan::Sequence a, b, c, d;
  text(a, 3, 1), block(a, kImage, 4), text(a, 6, 2);
  a.image_grid_thw = {{1, 4, 4}};
  text(b, 5, 3), block(b, kImage, 3), text(b, 3, 4);
  if (family == model::QwenVariant::qwen3_vl) {
    text(b, 2, 8), block(b, kVideo, 2), text(b, 2, 9), block(b, kVideo, 2);
  } else {
    block(b, kVideo, 4);
  }
  text(b, 2, 5);
  b.image_grid_thw = {{1, 2, 6}};
  b.video_grid_thw = {{2, 4, 2}};
  text(c, 9, 6);
  text(d, 21, 7);
  return {{a, b, c, d}};
}

// One step on random pixels of the batch's grids (24 values a patch: 3 channels x 2 x 2 x 2).
Result run(const model::ModelConfig& config, const plan::Batch& batch, const plan::StepPlan& plan,
           const parallel::StepGroups& groups, const dist::GroupPtr& world, model::VisionMode mode,
           at::ScalarType dtype = at::kDouble) {
  int64_t image_patches = 0, video_patches = 0;
  for (const plan::Sequence& s : batch.sequences) {
    for (const plan::Grid& g : s.image_grid_thw) image_patches += g[0] * g[1] * g[2];
    for (const plan::Grid& g : s.video_grid_thw) video_patches += g[0] * g[1] * g[2];
  }
  at::manual_seed(7);  // the batch's pixels, identical everywhere
  const model::PixelInputs pixels{at::randn({image_patches, 24}, dtype), at::randn({video_patches, 24}, dtype)};
  return run_model(config, batch, plan, groups, world, mode, pixels, dtype);
}

}  // namespace

// Qwen3-VL-MoE on 2 and 4 ranks (moe_meshes), with expert parallelism over 1, 2 and 4
// ranks (folded into the ring × Ulysses and the data-parallel ranks): the loss (the auxiliary loss included)
// and every gradient equal one process (fp64 1e-9), and so do the router's picks; and with
// recomputed decoder layers (the exchange runs again in the backward; the aux loss's
// gradient enters the recomputed layer).
TEST(MultiRankQwenVlMoe, LossAndEveryGradientEqualOneProcessWithExpertParallelism) {
  if (!test::moe_world_tested()) GTEST_SKIP() << "MoE cases run on 2 and 4 ranks";
  const model::ModelConfig config = tiny_qwen3_vl_moe();
  const plan::Batch batch = vision_batch(model::QwenVariant::qwen3_vl);
  at::manual_seed(7);
  const model::PixelInputs pixels{at::randn({16 + 12, 24}, at::kDouble), at::randn({16, 24}, at::kDouble)};
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const test::MoeStep ref = test::run_moe_model(config, batch, whole, nullptr, pixels);
  EXPECT_GT(ref.aux, 0.05) << "the auxiliary loss (coefficient 0.1 × E · Σ f·P >= 0.1 · 1) is missing";
  int64_t reached = 0;
  for (const auto& [name, g] : ref.result.grads)
    if (name.find("mlp.experts.gate_up_proj") != std::string::npos)
      for (int64_t e = 0; e < g.size(0); ++e) reached += g[e].abs().max().item<double>() > 0;
  EXPECT_GE(reached, 8) << "too few experts got tokens for the test to test the routing";
  for (const dist::Mesh* mesh : test::moe_meshes(8)) {
    if (mesh->shape().ulysses == 3) continue;  // 2 K/V heads cannot be split 3 ways
    plan::PlanOptions options;
    options.mesh = mesh->shape();
    const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh->rank());
    const test::MoeStep got = test::run_moe_model(config, batch, mine, mesh, pixels);
    test::expect_same_step(got.result, ref.result, 1e-9, "qwen3_vl_moe " + mesh->shape().str());
    EXPECT_TRUE(got.expert_counts.equal(ref.expert_counts)) << mesh->shape().str() << ": other picks";
    if (mesh->shape().expert > 1 && mesh->shape().dp == 1) {
      const test::MoeStep recomputed =
          test::run_moe_model(config, batch, mine, mesh, pixels, model::ActivationCheckpointing::decoder);
      test::expect_same_step(recomputed.result, ref.result, 1e-9, "recomputed " + mesh->shape().str());
    }
  }
}

class QwenVlFamily : public ::testing::TestWithParam<model::QwenVariant> {};

TEST_P(QwenVlFamily, MultiRankEqualsOneProcessInEveryVisionMode) {
  const model::ModelConfig config = tiny_config(GetParam());
  const plan::Batch batch = vision_batch(GetParam());
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const Result ref = run(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed);
  EXPECT_GT(ref.loss, 0);
  for (const auto& [name, g] : ref.grads)
    if (name.find("visual.") != std::string::npos && name.find("weight") != std::string::npos) {
      EXPECT_GT(g.abs().max().item<double>(), 0) << name << " gets no gradient: the vision path is cut";
    }

  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;  // 2 K/V heads cannot be split 3 ways
    plan::PlanOptions options;
    options.mesh = mesh.shape();
    const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
    for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
      const Result got = run(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world(), mode);
      const std::string where = mesh.shape().str() + " " + model::to_string(mode);
      test::expect_same_step(got, ref, 1e-9, where);
    }
  }
}

// Adaptive placement: short segments whole on one rank, long ones split; the same loss and
// gradients as one process (fp64 1e-9), in routed and gather mode.
TEST_P(QwenVlFamily, MultiRankAdaptivePlacementEqualsOneProcess) {
  const model::ModelConfig config = tiny_config(GetParam());
  const plan::Batch batch = vision_batch(GetParam());
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const Result ref = run(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed);
  int mixed = 0;
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;
    for (const plan::PlacementOptions& balance : kAdaptiveBalances) {
      const plan::StepPlan mine =
          plan::make_step_plan(batch, config.conventions, adaptive_options(mesh, balance), mesh.rank());
      const auto [w, sp] = whole_and_split(mine);
      mixed += w > 0 && (sp > 0 || mesh.shape().context() == 1);
      for (auto mode : {model::VisionMode::routed, model::VisionMode::gather}) {
        const Result got = run(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world(), mode);
        test::expect_same_step(got, ref, 1e-9,
                               mesh.shape().str() + " adaptive " + std::to_string(w) + " whole " + std::to_string(sp) +
                                   " split " + model::to_string(mode));
      }
    }
  }
  EXPECT_GT(mixed, 0) << "no mesh mixed whole and split segments: the test would not test the mix";
}

// fp32: the same comparison at fp32's tolerance (rtol 1e-4), every family and mode.
TEST_P(QwenVlFamily, MultiRankFp32EqualsOneProcessInEveryVisionMode) {
  const model::ModelConfig config = tiny_config(GetParam());
  const plan::Batch batch = vision_batch(GetParam());
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const Result ref = run(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed, at::kFloat);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;
    plan::PlanOptions options;
    options.mesh = mesh.shape();
    const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
    for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
      const Result got =
          run(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world(), mode, at::kFloat);
      test::expect_same_step(got, ref, 1e-4, mesh.shape().str() + " fp32 " + model::to_string(mode));
    }
  }
}

// Vision-tower SP: the tiny towers with 12 heads (4 wide), which divide by 2, 3 and 4
// context ranks, so that an item can be split over any context group of the meshes.
model::ModelConfig twelve_vision_heads(model::QwenVariant family) {
  nlohmann::json c = family == model::QwenVariant::qwen3_vl     ? tiny_qwen3_vl_json()
                     : family == model::QwenVariant::qwen2_5_vl ? tiny_qwen2_5_vl_json()
                                                                : tiny_qwen2_vl_json();
  c["vision_config"][family == model::QwenVariant::qwen2_vl ? "embed_dim" : "hidden_size"] = 48;
  c["vision_config"]["num_heads"] = 12;
  return model::parse_model_config(c, "tiny " + model::to_string(family) + " with 12 vision heads");
}

// An image of 6 × 10 patches (15 merged rows: uneven over 2 and 4 ranks; Qwen2.5-VL's
// 2 × 2-unit windows cut short at its edge) and a two-frame video of 4 × 4 (8 rows; Qwen3-VL:
// two items of 4) to split, a 2 × 6 image (3 rows) to keep whole, text around them and two
// text-only sequences (one per dp rank on 4).
plan::Batch split_batch(model::QwenVariant family) {
  plan::Sequence a, b, c, d;
  text(a, 3, 1), block(a, kImage, 15), text(a, 6, 2);
  a.image_grid_thw = {{1, 6, 10}};
  text(b, 5, 3), block(b, kImage, 3), text(b, 3, 4);
  if (family == model::QwenVariant::qwen3_vl) {
    text(b, 2, 8), block(b, kVideo, 4), text(b, 2, 9), block(b, kVideo, 4);
  } else {
    block(b, kVideo, 8);
  }
  text(b, 2, 5);
  b.image_grid_thw = {{1, 2, 6}};
  b.video_grid_thw = {{2, 4, 4}};
  if (family == model::QwenVariant::qwen2_5_vl) b.second_per_grid_ts = {0.5};
  text(c, 17, 6);
  text(d, 11, 7);
  return {{a, b, c, d}};
}

// Items split over the context group (--vision-split 16: every item of 16 patches or more)
// beside an item encoded whole, on every mesh: the loss and every gradient equal one
// process's (fp64 1e-9) in each vision mode (replicate encodes every item whole).
TEST_P(QwenVlFamily, MultiRankSplitItemsEqualOneProcess) {
  const model::ModelConfig config = twelve_vision_heads(GetParam());
  const plan::Batch batch = split_batch(GetParam());
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const Result ref = run(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;  // the decoder's 2 K/V heads cannot be split 3 ways
    plan::PlanOptions options;
    options.mesh = mesh.shape();
    options.vision_split = plan::parse_vision_split("16");
    const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
    int64_t split = 0, kept = 0;
    for (const plan::RowPlan& row : mine.rows)
      for (const plan::VisionItem& it : row.items) ++(it.split() ? split : kept);
    if (mesh.shape().context() > 1) {
      EXPECT_GE(split, 2) << mesh.shape().str();
      EXPECT_GE(kept, 1) << mesh.shape().str();
    }
    for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
      const Result got = run(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world(), mode);
      test::expect_same_step(got, ref, 1e-9,
                             mesh.shape().str() + " split " + std::to_string(split) + " " + model::to_string(mode));
    }
  }
}

// Named MultiRank* so that the multi-rank runs pick it up.
INSTANTIATE_TEST_SUITE_P(MultiRank, QwenVlFamily,
                         ::testing::Values(model::QwenVariant::qwen2_vl, model::QwenVariant::qwen2_5_vl,
                                           model::QwenVariant::qwen3_vl),
                         [](const auto& info) { return model::to_string(info.param); });

// The batch exercises the hard cases of routing: on 4 ranks some rank encodes nothing
// and some item's rows land on more than one rank.
TEST(VisionBatch, HasEmptyEncodersAndStraddlingItemsOnFourRanks) {
  const model::ModelConfig config = tiny_qwen2_vl();
  const plan::Batch batch = vision_batch();
  plan::PlanOptions options;
  options.mesh = {1, 2, 2};
  const plan::StepPlan p = plan::make_step_plan(batch, config.conventions, options, 0);
  std::set<int> encoders;
  for (const auto& item : p.rows[0].items) encoders.insert(item.encoder_rank);
  EXPECT_LT(encoders.size(), 4u);
  std::vector<std::set<int>> holders(p.rows[0].items.size());
  for (int r = 0; r < 4; ++r)
    for (const auto& from : plan::make_rank_plan(batch, p, r).routes.recv)
      for (const auto& row : from) holders[row.item].insert(r);
  bool straddles = false;
  for (const auto& h : holders) straddles |= h.size() > 1;
  EXPECT_TRUE(straddles);
}

// Qwen2.5-VL's batch: on 4 ranks its big image holds more rows than a rank's share of
// the tokens (so its rows reach several ranks), and some rank encodes no item.
TEST(VisionBatch, Qwen2_5BigImageAndAnIdleEncoderOnFourRanks) {
  const model::ModelConfig config = tiny_qwen2_5_vl();
  const plan::Batch batch = qwen2_5_batch();
  int64_t tokens = 0;
  for (const auto& s : batch.sequences) tokens += static_cast<int64_t>(s.input_ids.size());
  EXPECT_GT(32 * 4, tokens);  // 32 rows > a rank's share
  plan::PlanOptions options;
  options.mesh = {1, 2, 2};
  const plan::StepPlan p = plan::make_step_plan(batch, config.conventions, options, 0);
  std::set<int> encoders;
  for (const auto& item : p.rows[0].items) encoders.insert(item.encoder_rank);
  EXPECT_LT(encoders.size(), 4u);
  std::set<int> holders_of_big;
  for (int r = 0; r < 4; ++r)
    for (const auto& from : plan::make_rank_plan(batch, p, r).routes.recv)
      for (const auto& row : from)
        if (p.rows[0].items[row.item].grid == plan::Grid{1, 8, 16}) holders_of_big.insert(r);
  EXPECT_GE(holders_of_big.size(), 2u);
}

// Save as a Hugging Face directory, load into a differently initialised model:
// identical logits, under the released files' names.
TEST(QwenVlWeights, RoundTripGivesIdenticalOutputs) {
  const model::ModelConfig config = tiny_qwen2_vl();
  const plan::Batch batch = vision_batch();
  const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, {}, 0);
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  at::manual_seed(7);
  model::PixelInputs pixels{at::randn({16 + 12, 24}), at::randn({16, 24})};
  auto logits_of = [&](const model::Vlm& m) {
    return parallel::forward_step(m, batch, plan, pixels, {solo, solo, solo}, model::VisionMode::routed)
        .logits()
        .detach();
  };
  at::manual_seed(1);
  auto a_ptr = model::build_vlm(config);
  model::Vlm& a = *a_ptr;
  at::manual_seed(2);
  auto b_ptr = model::build_vlm(config);
  model::Vlm& b = *b_ptr;
  const std::string dir = "/tmp/mmsp-test-weights-" + std::to_string(getpid());
  std::vector<std::pair<std::string, Tensor>> params_a, params_b;
  for (const auto& item : a.named_parameters()) params_a.emplace_back(item.key(), item.value().detach());
  for (const auto& item : b.named_parameters()) params_b.emplace_back(item.key(), item.value());
  hf::save_hf_directory(dir, params_a, R"({"model_type": "qwen2_vl"})");
  EXPECT_FALSE(logits_of(a).equal(logits_of(b)));
  const hf::HfDirectory hf = hf::open_hf_directory(dir);
  hf::load_hf_weights(hf, params_b, model::checkpoint_naming(config));
  EXPECT_TRUE(logits_of(a).equal(logits_of(b)));
  EXPECT_EQ(hf.tensors.count("visual.patch_embed.proj.weight"), 1u);
  EXPECT_EQ(hf.tensors.at("visual.patch_embed.proj.weight").entry.shape, (std::vector<int64_t>{16, 3, 2, 2, 2}));
  EXPECT_EQ(hf.tensors.count("visual.merger.mlp.2.bias"), 1u);
  EXPECT_EQ(hf.tensors.count("model.layers.1.mlp.up_proj.weight"), 1u);
  std::filesystem::remove_all(dir);
}
