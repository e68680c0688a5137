// The hybrid decoder (Qwen3.5 / Qwen3-Next: full-attention and Gated DeltaNet layers)
// read from config.json. On one process, each layer kind equals a plain reference written
// from transformers' Qwen3.5 code (separate GDN projections, output-gated attention with
// partial RoPE, (1 + w) norms); the parameter names are the checkpoints'. Under mmsp-run,
// on every mesh of the world, the Qwen3.5 VLM (Qwen3-VL vision tower) and the decoder
// alone with short GDN chunks equal one process: loss and every parameter gradient, fp64.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "gated_delta_reference.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/model/family.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/parallel/decoder_attention.h"
#include "mmsp/parallel/step_parallelism.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "moe_step.h"
#include "multirank.h"
#include "sp_compare.h"

using namespace mmsp;
using at::Tensor;

namespace {

using test::kStart, test::kEnd, test::kImage, test::kVideo, test::text, test::block;

// Hidden 32; layers [linear, full, linear]; attention 4 heads / 2 KV heads of 16, half of
// each rotated (mRoPE [2, 1, 1]); GDN H_k 4 < H_v 8 (every ulysses degree but 3 divides
// both), K 8 ≠ V 4; a one-block vision tower of width 16. text_type "qwen3_next" gives
// Qwen3-Next's fused GDN projections with a dense MLP.
model::ModelConfig tiny_hybrid(const std::string& text_type = "qwen3_5_text") {
  nlohmann::json c = {{"model_type", "qwen3_5"},
                      {"tie_word_embeddings", false},
                      {"vision_start_token_id", kStart},
                      {"vision_end_token_id", kEnd},
                      {"image_token_id", kImage},
                      {"video_token_id", kVideo},
                      {"text_config",
                       {{"model_type", text_type},
                        {"vocab_size", 128},
                        {"hidden_size", 32},
                        {"intermediate_size", 48},
                        {"num_hidden_layers", 3},
                        {"layer_types", {"linear_attention", "full_attention", "linear_attention"}},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"head_dim", 16},
                        {"linear_num_key_heads", 4},
                        {"linear_num_value_heads", 8},
                        {"linear_key_head_dim", 8},
                        {"linear_value_head_dim", 4},
                        {"linear_conv_kernel_dim", 4},
                        {"num_experts", 0},
                        {"rms_norm_eps", 1e-6},
                        {"rope_parameters",
                         {{"rope_type", "default"},
                          {"rope_theta", 10000.0},
                          {"partial_rotary_factor", 0.5},
                          {"mrope_interleaved", true},
                          {"mrope_section", {2, 1, 1}}}}}},
                      {"vision_config",
                       {{"model_type", "qwen3_5_vision"},
                        {"depth", 1},
                        {"hidden_size", 16},
                        {"intermediate_size", 32},
                        {"num_heads", 2},
                        {"in_channels", 3},
                        {"patch_size", 2},
                        {"temporal_patch_size", 2},
                        {"spatial_merge_size", 2},
                        {"out_hidden_size", 32},
                        {"num_position_embeddings", 16},
                        {"deepstack_visual_indexes", nlohmann::json::array()}}}};
  return model::parse_model_config(c, "tiny hybrid " + text_type);
}

// Qwen3.5-MoE: the hybrid decoder with every MLP a mixture of 8 experts (top 2, per-expert
// weights) and the shared expert behind its sigmoid gate; the auxiliary loss at 0.1.
model::ModelConfig tiny_hybrid_moe() {
  nlohmann::json c = {{"model_type", "qwen3_5_moe"},
                      {"tie_word_embeddings", false},
                      {"vision_start_token_id", kStart},
                      {"vision_end_token_id", kEnd},
                      {"image_token_id", kImage},
                      {"video_token_id", kVideo},
                      {"text_config",
                       {{"model_type", "qwen3_5_moe_text"},
                        {"vocab_size", 128},
                        {"hidden_size", 32},
                        {"num_hidden_layers", 3},
                        {"layer_types", {"linear_attention", "full_attention", "linear_attention"}},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"head_dim", 16},
                        {"linear_num_key_heads", 4},
                        {"linear_num_value_heads", 8},
                        {"linear_key_head_dim", 8},
                        {"linear_value_head_dim", 4},
                        {"linear_conv_kernel_dim", 4},
                        {"num_experts", 8},
                        {"num_experts_per_tok", 2},
                        {"moe_intermediate_size", 12},
                        {"shared_expert_intermediate_size", 20},
                        {"output_router_logits", true},
                        {"router_aux_loss_coef", 0.1},
                        {"rms_norm_eps", 1e-6},
                        {"rope_parameters",
                         {{"rope_type", "default"},
                          {"rope_theta", 10000.0},
                          {"partial_rotary_factor", 0.5},
                          {"mrope_interleaved", true},
                          {"mrope_section", {2, 1, 1}}}}}},
                      {"vision_config",
                       {{"model_type", "qwen3_5_moe_vision"},
                        {"depth", 1},
                        {"hidden_size", 16},
                        {"intermediate_size", 32},
                        {"num_heads", 2},
                        {"in_channels", 3},
                        {"patch_size", 2},
                        {"temporal_patch_size", 2},
                        {"spatial_merge_size", 2},
                        {"out_hidden_size", 32},
                        {"num_position_embeddings", 16},
                        {"deepstack_visual_indexes", nlohmann::json::array()}}}};
  return model::parse_model_config(c, "tiny hybrid moe");
}

// Two images (the 4-row one cut by shard borders on most meshes) and a two-frame video
// (one block per frame, after its timestamp text), text around them, a text-only
// sequence and one of 2 tokens (shorter than the conv kernel); every segment is shorter
// than a GDN chunk (64).
plan::Batch vision_batch() {
  plan::Sequence a, b, c, d;
  text(a, 3, 1), block(a, kImage, 4), text(a, 6, 2);
  a.image_grid_thw = {{1, 4, 4}};
  text(b, 5, 3), block(b, kImage, 3), text(b, 3, 4);
  text(b, 2, 8), block(b, kVideo, 2), text(b, 2, 9), block(b, kVideo, 2), text(b, 2, 5);
  b.image_grid_thw = {{1, 2, 6}};
  b.video_grid_thw = {{2, 4, 2}};
  text(c, 2, 6);
  text(d, 21, 7);
  return {{a, b, c, d}};
}

using Result = test::StepResult;

Result run_vlm(const model::ModelConfig& config, const plan::Batch& batch, const plan::StepPlan& plan,
               const parallel::StepGroups& groups, const dist::GroupPtr& world) {
  at::manual_seed(7);  // the batch's pixels, identical everywhere
  const model::PixelInputs pixels{at::randn({16 + 12, 24}, at::kDouble), at::randn({16, 24}, at::kDouble)};
  at::manual_seed(42);
  auto vlm = model::build_vlm(config);
  vlm->to(at::kDouble);
  attention::AttentionOptions attn;
  attn.block_q = 8;
  attn.block_k = 8;
  auto out = parallel::forward_step(*vlm, batch, plan, pixels, groups, model::VisionMode::routed, attn);
  Tensor loss = train::causal_lm_loss(out.logits(), out.labels, out.label_count);
  loss.backward();
  return test::summed_over(*vlm, loss, world);
}

// The decoder alone on a text batch, GDN chunks of `chunk` tokens.
Result run_decoder(const model::ModelConfig& config, const plan::Batch& batch, const plan::StepPlan& plan,
                   const attention::ContextGroups& groups, const dist::GroupPtr& world, int64_t chunk) {
  at::manual_seed(42);
  auto decoder = std::make_shared<model::Decoder>(config.text, config.tie_word_embeddings);
  decoder->to(at::kDouble);
  const model::RankInputs in = model::rank_inputs(batch, plan);
  attention::AttentionOptions attn;
  attn.block_q = 8;
  attn.block_k = 16;
  const Tensor like = at::zeros({}, at::kDouble);
  const model::DecoderContext ctx =
      parallel::decoder_context(in, config.text, config.conventions, groups, attn, like, chunk);
  Tensor logits = decoder->forward(decoder->embed(in.token_ids), ctx);
  Tensor loss = train::causal_lm_loss(logits, in.labels, in.label_count);
  loss.backward();
  return test::summed_over(*decoder, loss, world);
}

// Meshes whose ulysses degree divides every head count of the tiny config (not 3).
bool fits(const dist::Mesh& mesh) { return mesh.shape().ulysses != 3; }

plan::PlanOptions options_for(const dist::Mesh& mesh) {
  plan::PlanOptions options;
  options.mesh = mesh.shape();
  return options;
}

}  // namespace

TEST(MultiRankHybrid, Qwen3_5VlmLossAndEveryGradientEqualOneProcess) {
  const model::ModelConfig config = tiny_hybrid();
  const plan::Batch batch = vision_batch();
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const Result ref = run_vlm(config, batch, whole, {solo, solo, solo}, solo);
  EXPECT_GT(ref.loss, 0);
  for (const auto& [name, g] : ref.grads) {
    if (name.find("weight") != std::string::npos || name.find("A_log") != std::string::npos) {
      EXPECT_GT(g.abs().max().item<double>(), 0) << name << " gets no gradient";
    }
  }
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (!fits(mesh)) continue;
    const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options_for(mesh), mesh.rank());
    const Result got = run_vlm(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world());
    test::expect_same_step(got, ref, 1e-9, "qwen3_5 " + mesh.shape().str());
  }
}

// Qwen3.5-MoE on 2 and 4 ranks (moe_meshes), with expert parallelism over 1, 2 and 4
// ranks: the loss (the auxiliary loss included) and every gradient equal one process (fp64 1e-9), and so do the
// router's picks; with recomputed layers too. Ulysses must divide the GDN's 4 key heads.
TEST(MultiRankHybrid, Qwen3_5MoeLossAndEveryGradientEqualOneProcessWithExpertParallelism) {
  if (!test::moe_world_tested()) GTEST_SKIP() << "MoE cases run on 2 and 4 ranks";
  const model::ModelConfig config = tiny_hybrid_moe();
  const plan::Batch batch = vision_batch();
  at::manual_seed(7);
  const model::PixelInputs pixels{at::randn({16 + 12, 24}, at::kDouble), at::randn({16, 24}, at::kDouble)};
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const test::MoeStep ref = test::run_moe_model(config, batch, whole, nullptr, pixels);
  EXPECT_GT(ref.aux, 0.05) << "the auxiliary loss is missing";
  for (const auto& [name, g] : ref.result.grads)
    if (name.find("shared_expert") != std::string::npos || name.find("mlp.gate.") != std::string::npos) {
      EXPECT_GT(g.abs().max().item<double>(), 0) << name << " gets no gradient";
    }
  for (const dist::Mesh* mesh : test::moe_meshes(8)) {
    if (!fits(*mesh)) continue;
    const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options_for(*mesh), mesh->rank());
    const test::MoeStep got = test::run_moe_model(config, batch, mine, mesh, pixels);
    test::expect_same_step(got.result, ref.result, 1e-9, "qwen3_5_moe " + mesh->shape().str());
    EXPECT_TRUE(got.expert_counts.equal(ref.expert_counts)) << mesh->shape().str() << ": other picks";
    if (mesh->shape().expert > 1 && mesh->shape().dp == 1) {
      const test::MoeStep recomputed =
          test::run_moe_model(config, batch, mine, mesh, pixels, model::ActivationCheckpointing::decoder);
      test::expect_same_step(recomputed.result, ref.result, 1e-9, "recomputed " + mesh->shape().str());
    }
  }
}

// The experts under their checkpoint names (per expert, with the router and the shared
// expert); under expert parallelism a rank holds its block's experts only.
TEST(HybridNames, MixtureOfExpertsNames) {
  model::ModelConfig config = tiny_hybrid_moe();
  model::set_expert_shard(config.text.moe, 4, 1);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model::build_vlm(config)->named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  const std::string mlp = "model.language_model.layers.2.mlp.";
  EXPECT_EQ(shapes[mlp + "gate.weight"], (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(shapes[mlp + "shared_expert.gate_proj.weight"], (std::vector<int64_t>{20, 32}));
  EXPECT_EQ(shapes[mlp + "shared_expert.down_proj.weight"], (std::vector<int64_t>{32, 20}));
  EXPECT_EQ(shapes[mlp + "shared_expert_gate.weight"], (std::vector<int64_t>{1, 32}));
  for (int e = 0; e < 8; ++e) {
    const bool mine = e == 2 || e == 3;  // block 1 of 4: experts 2 and 3
    EXPECT_EQ(shapes.count(mlp + "experts." + std::to_string(e) + ".up_proj.weight"), mine ? 1u : 0u) << e;
  }
  EXPECT_EQ(shapes[mlp + "experts.3.down_proj.weight"], (std::vector<int64_t>{32, 12}));
}

// Adaptive placement: a whole segment needs no Gated DeltaNet state passing and stays home;
// split ones go through Ulysses (all-to-all-v) and the ring, on every mesh (one ring rank
// with ulysses > 1 too: the split shares are whole segments in order). Loose balance targets so that these small
// batches keep segments whole (every one, or a mix), as in the Qwen family's test_qwen_vl_sp.
TEST(MultiRankHybrid, AdaptivePlacementEqualsOneProcess) {
  const model::ModelConfig config = tiny_hybrid();
  const plan::Batch batch = vision_batch();
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const Result ref = run_vlm(config, batch, whole, {solo, solo, solo}, solo);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (!fits(mesh)) continue;
    for (const plan::PlacementOptions balance :
         {plan::PlacementOptions{1.0, 100.0}, plan::PlacementOptions{0.25, 1.3}}) {
      plan::PlanOptions options = options_for(mesh);
      options.placement = plan::Placement::adaptive;
      options.placement_balance = balance;
      const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
      const Result got = run_vlm(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world());
      test::expect_same_step(got, ref, 1e-9, "qwen3_5 adaptive " + mesh.shape().str());
    }
  }
}

// Chunks of 8 so that segments span several chunks (and runs start mid-chunk on the
// ring); both GDN layouts (Qwen3.5's separate projections, Qwen3-Next's fused ones).
TEST(MultiRankHybrid, DecoderWithShortChunksEqualsOneProcess) {
  for (const std::string text_type : {"qwen3_5_text", "qwen3_next"}) {
    const model::ModelConfig config = tiny_hybrid(text_type);
    std::mt19937 rng(11);
    plan::Batch batch;
    for (int n : {37, 1, 9, 3, 26}) {
      plan::Sequence s;
      for (int i = 0; i < n; ++i) s.input_ids.push_back(std::uniform_int_distribution<int>(0, 99)(rng));
      batch.sequences.push_back(s);
    }
    const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
    const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
    const Result ref = run_decoder(config, batch, whole, {solo, solo}, solo, 8);
    for (const dist::Mesh& mesh : test::all_meshes()) {
      if (!fits(mesh)) continue;
      const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options_for(mesh), mesh.rank());
      const Result got = run_decoder(config, batch, mine, {mesh.ring(), mesh.ulysses()}, mesh.world(), 8);
      test::expect_same_step(got, ref, 1e-9, text_type + " " + mesh.shape().str());
    }
  }
}

// ---------- one process: names, and each layer kind against transformers' formulas ----------

TEST(HybridNames, AreTheCheckpointNames) {
  for (const std::string text_type : {"qwen3_5_text", "qwen3_next"}) {
    const model::ModelConfig config = tiny_hybrid(text_type);
    auto built = model::build_vlm(config);
    model::Vlm& vlm = *built;
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& item : vlm.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
    auto shape = [&](const std::string& name) {
      EXPECT_EQ(shapes.count(name), 1u) << text_type << ": " << name;
      return shapes.count(name) ? shapes.at(name) : std::vector<int64_t>{};
    };
    const std::string gdn = "model.language_model.layers.0.linear_attn.";
    if (text_type == "qwen3_5_text") {
      EXPECT_EQ(shape(gdn + "in_proj_qkv.weight"), (std::vector<int64_t>{2 * 4 * 8 + 8 * 4, 32}));
      EXPECT_EQ(shape(gdn + "in_proj_z.weight"), (std::vector<int64_t>{8 * 4, 32}));
      EXPECT_EQ(shape(gdn + "in_proj_b.weight"), (std::vector<int64_t>{8, 32}));
      EXPECT_EQ(shape(gdn + "in_proj_a.weight"), (std::vector<int64_t>{8, 32}));
      EXPECT_EQ(shapes.count(gdn + "in_proj_qkvz.weight"), 0u);
    } else {
      EXPECT_EQ(shape(gdn + "in_proj_qkvz.weight"), (std::vector<int64_t>{2 * 4 * 8 + 2 * 8 * 4, 32}));
      EXPECT_EQ(shape(gdn + "in_proj_ba.weight"), (std::vector<int64_t>{2 * 8, 32}));
      EXPECT_EQ(shapes.count(gdn + "in_proj_qkv.weight"), 0u);
    }
    EXPECT_EQ(shape(gdn + "conv1d.weight"), (std::vector<int64_t>{2 * 4 * 8 + 8 * 4, 1, 4}));
    EXPECT_EQ(shape(gdn + "A_log"), (std::vector<int64_t>{8}));
    EXPECT_EQ(shape(gdn + "dt_bias"), (std::vector<int64_t>{8}));
    EXPECT_EQ(shape(gdn + "norm.weight"), (std::vector<int64_t>{4}));
    EXPECT_EQ(shape(gdn + "out_proj.weight"), (std::vector<int64_t>{32, 8 * 4}));
    const std::string attn = "model.language_model.layers.1.self_attn.";
    EXPECT_EQ(shape(attn + "q_proj.weight"), (std::vector<int64_t>{2 * 4 * 16, 32}));  // query and gate
    EXPECT_EQ(shape(attn + "k_proj.weight"), (std::vector<int64_t>{2 * 16, 32}));
    EXPECT_EQ(shape(attn + "q_norm.weight"), (std::vector<int64_t>{16}));
    EXPECT_EQ(shape(attn + "o_proj.weight"), (std::vector<int64_t>{32, 4 * 16}));
    for (const char* name :
         {"model.language_model.embed_tokens.weight", "model.language_model.norm.weight",
          "model.language_model.layers.2.mlp.down_proj.weight", "model.language_model.layers.0.input_layernorm.weight",
          "model.visual.patch_embed.proj.weight", "model.visual.merger.linear_fc2.weight", "lm_head.weight"})
      shape(name);
    for (const auto& [name, s] : shapes) {
      EXPECT_EQ(name.find("layers.0.self_attn"), std::string::npos) << name;
      EXPECT_EQ(name.find("layers.1.linear_attn"), std::string::npos) << name;
      EXPECT_EQ(name.find("deepstack"), std::string::npos) << name;  // Qwen3.5's tower has none
      if (name.rfind("model.language_model.", 0) == 0) {             // attention_bias false, GDN without biases
        EXPECT_TRUE(name.find(".bias") == std::string::npos || name.find("dt_bias") != std::string::npos) << name;
      }
    }
    // Norms stored as offsets from 1 start at 0 (transformers' init); the GDN's gated norm at 1.
    EXPECT_TRUE(vlm.named_parameters()["model.language_model.norm.weight"].eq(0).all().item<bool>());
    EXPECT_TRUE(vlm.named_parameters()[gdn + "norm.weight"].eq(1).all().item<bool>());
  }
}

namespace {

// transformers' Qwen3_5RMSNorm: x / rms(x) · (1 + w).
Tensor rms1p(const Tensor& x, const Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * (1 + w);
}

Tensor rotate_half(const Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// Qwen3_5Attention on one text segment (positions 0..T-1 on every mRoPE axis, i.e. 1-D
// RoPE over the first rotary_dim channels), written from transformers' code.
Tensor attention_reference(const std::map<std::string, Tensor>& p, const model::TextConfig& c, const Tensor& x) {
  const int64_t T = x.size(0), H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const int64_t rd = c.rotary_dim();
  auto [q, gate] = [&] {
    auto parts = at::chunk(at::matmul(x, p.at("self_attn.q_proj.weight").t()).view({T, H, 2 * D}), 2, -1);
    return std::make_pair(parts[0], parts[1].reshape({T, H * D}));
  }();
  Tensor k = at::matmul(x, p.at("self_attn.k_proj.weight").t()).view({T, Hkv, D});
  Tensor v = at::matmul(x, p.at("self_attn.v_proj.weight").t()).view({T, Hkv, D});
  q = rms1p(q, p.at("self_attn.q_norm.weight"), c.rms_norm_eps);
  k = rms1p(k, p.at("self_attn.k_norm.weight"), c.rms_norm_eps);
  Tensor inv = at::pow(c.rope_theta, at::arange(0, rd, 2, at::kDouble) / double(rd)).reciprocal();
  Tensor ang = at::arange(T, at::kDouble).unsqueeze(1) * inv.unsqueeze(0);  // [T, rd/2]
  Tensor cos = at::cat({ang.cos(), ang.cos()}, 1).unsqueeze(1), sin = at::cat({ang.sin(), ang.sin()}, 1).unsqueeze(1);
  auto rope = [&](const Tensor& t) {
    Tensor r = t.narrow(-1, 0, rd);
    return at::cat({r * cos + rotate_half(r) * sin, t.narrow(-1, rd, D - rd)}, -1);
  };
  q = rope(q).transpose(0, 1);  // [H, T, D]
  k = rope(k).repeat_interleave(H / Hkv, 1).transpose(0, 1);
  v = v.repeat_interleave(H / Hkv, 1).transpose(0, 1);
  Tensor scores = at::matmul(q, k.transpose(1, 2)) / std::sqrt(double(D));
  scores = scores.masked_fill(at::ones({T, T}, at::kBool).triu(1), -INFINITY);
  Tensor o = at::matmul(at::softmax(scores, -1), v).transpose(0, 1).reshape({T, H * D});
  return at::matmul(o * at::sigmoid(gate), p.at("self_attn.o_proj.weight").t());
}

// Qwen3_5GatedDeltaNet on one segment: separate projections, F.conv1d, the recurrence.
Tensor gdn_reference(const std::map<std::string, Tensor>& p, const model::TextConfig& c, const Tensor& x,
                     const attention::TokenLayout& layout) {
  const int64_t T = x.size(0), Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t K = c.linear_key_head_dim, V = c.linear_value_head_dim, W = c.linear_conv_kernel_dim;
  Tensor mixed = at::matmul(x, p.at("linear_attn.in_proj_qkv.weight").t());  // [T, 2·Hk·K + Hv·V]
  const Tensor& cw = p.at("linear_attn.conv1d.weight");
  mixed = at::silu(at::conv1d(mixed.t().unsqueeze(0), cw, {}, 1, W - 1, 1, cw.size(0)).squeeze(0).narrow(1, 0, T).t());
  auto l2 = [](const Tensor& t) { return t * at::rsqrt(t.pow(2).sum(-1, true) + 1e-6); };
  Tensor q = l2(mixed.narrow(1, 0, Hk * K).view({T, Hk, K})).repeat_interleave(Hv / Hk, 1);
  Tensor k = l2(mixed.narrow(1, Hk * K, Hk * K).view({T, Hk, K})).repeat_interleave(Hv / Hk, 1);
  Tensor v = mixed.narrow(1, 2 * Hk * K, Hv * V).view({T, Hv, V});
  Tensor z = at::matmul(x, p.at("linear_attn.in_proj_z.weight").t()).view({T, Hv, V});
  Tensor b = at::matmul(x, p.at("linear_attn.in_proj_b.weight").t());
  Tensor a = at::matmul(x, p.at("linear_attn.in_proj_a.weight").t());
  Tensor g = -p.at("linear_attn.A_log").exp() * at::softplus(a + p.at("linear_attn.dt_bias"));
  Tensor o = attention::gated_delta_recurrence(q, k, v, g, at::sigmoid(b), layout);
  Tensor normed =
      o * at::rsqrt(o.pow(2).mean(-1, true) + c.rms_norm_eps) * p.at("linear_attn.norm.weight") * at::silu(z);
  return at::matmul(normed.reshape({T, Hv * V}), p.at("linear_attn.out_proj.weight").t());
}

}  // namespace

TEST(HybridLayers, EachKindEqualsTransformersQwen3_5OnOneProcess) {
  const model::ModelConfig config = tiny_hybrid();
  const model::TextConfig& c = config.text;
  plan::Batch batch;
  plan::Sequence s;
  text(s, 70, 3);  // more than a chunk
  batch.sequences.push_back(s);
  const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, {}, 0);
  const model::RankInputs in = model::rank_inputs(batch, plan);
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const Tensor like = at::zeros({}, at::kDouble);
  const model::DecoderContext ctx = parallel::decoder_context(in, c, config.conventions, {solo, solo}, {}, like);
  const int64_t T = in.token_ids.size(0);
  ASSERT_EQ(T, 70);  // one segment, no padding on one process
  for (int64_t index : {0, 1}) {
    at::manual_seed(3 + index);
    model::DecoderLayer layer(c, index);
    layer.to(at::kDouble);
    std::map<std::string, Tensor> p;
    for (const auto& item : layer.named_parameters()) {
      // Every weight random, so a norm stored as an offset from 1 cannot pass as a plain one.
      item.value().detach().copy_(at::randn(item.value().sizes(), at::kDouble) * 0.3 +
                                  (item.key().find("A_log") != std::string::npos ? 1.0 : 0.0));
      p[item.key()] = item.value().detach();
    }
    const Tensor x = at::randn({T, c.hidden_size}, at::kDouble);
    const Tensor got = layer.forward(x, ctx);
    const Tensor xn = rms1p(x, p.at("input_layernorm.weight"), c.rms_norm_eps);
    const Tensor h = x + (index == 0 ? gdn_reference(p, c, xn, in.ring_shares[0]) : attention_reference(p, c, xn));
    const Tensor y = rms1p(h, p.at("post_attention_layernorm.weight"), c.rms_norm_eps);
    const Tensor want = h + at::matmul(at::silu(at::matmul(y, p.at("mlp.gate_proj.weight").t())) *
                                           at::matmul(y, p.at("mlp.up_proj.weight").t()),
                                       p.at("mlp.down_proj.weight").t());
    const double diff = (got - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-9 * (1 + want.abs().max().item<double>()))
        << model::to_string(layer.kind()) << " layer differs by " << diff;
  }
}
