// The memory layers change where activations live, not what is computed: the decoder
// with its MLPs tiled (tiled_mlp.h) and with its recomputed layers' inputs offloaded
// (activation_offload.h) gives the loss and every gradient of the plain decoder (fp64:
// tiled to 1e-12, the weights' gradients being summed over tiles; offloaded bitwise,
// a copy changes no value), for a Qwen2-VL decoder, a Llama one with MLP biases and the
// Qwen3.5 hybrid (Gated DeltaNet layers share the MLP). The memory counter shows what
// tiling is for: the backward's peak holds one tile's intermediate, not the sequence's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <random>

#include "mmsp/core/check.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/hooks/activation_offload.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/layers/decoder.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/parallel/decoder_attention.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "mmsp/train/memory/memory_counter.h"

using namespace mmsp;
using at::Tensor;
using ::testing::HasSubstr;

namespace {

nlohmann::json text_config(const std::string& type, int64_t intermediate) {
  return {{"model_type", type},       {"vocab_size", 128},
          {"hidden_size", 32},        {"intermediate_size", intermediate},
          {"num_hidden_layers", 3},   {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0}};
}

// "qwen2_vl": mRoPE, q/k/v biases; "llava": Llama with MLP biases; "qwen3_5": layers
// [linear, full, linear] (Gated DeltaNet) around the same MLP.
model::ModelConfig decoder_config(const std::string& family, int64_t intermediate = 80) {
  const nlohmann::json qwen_vision = {
      {"depth", 1},      {"embed_dim", 16},         {"hidden_size", 32},        {"num_heads", 2}, {"mlp_ratio", 2},
      {"patch_size", 2}, {"spatial_merge_size", 2}, {"temporal_patch_size", 2}, {"in_chans", 3}};
  if (family == "llava") {
    nlohmann::json text = text_config("llama", intermediate);
    text["mlp_bias"] = true;
    const nlohmann::json c = {{"model_type", "llava"},
                              {"image_token_index", 122},
                              {"image_seq_length", 16},
                              {"tie_word_embeddings", false},
                              {"text_config", text},
                              {"vision_config",
                               {{"model_type", "clip_vision_model"},
                                {"hidden_size", 16},
                                {"intermediate_size", 32},
                                {"num_hidden_layers", 1},
                                {"num_attention_heads", 2},
                                {"image_size", 8},
                                {"patch_size", 2},
                                {"projection_dim", 16},
                                {"hidden_act", "quick_gelu"},
                                {"layer_norm_eps", 1e-5}}}};
    return model::parse_model_config(c, "tiny llava");
  }
  if (family == "qwen3_5") {
    nlohmann::json text = text_config("qwen3_5_text", intermediate);
    text["layer_types"] = {"linear_attention", "full_attention", "linear_attention"};
    text["head_dim"] = 16;
    text["linear_num_key_heads"] = 4;
    text["linear_num_value_heads"] = 8;
    text["linear_key_head_dim"] = 8;
    text["linear_value_head_dim"] = 4;
    text["linear_conv_kernel_dim"] = 4;
    text["num_experts"] = 0;
    text["rope_parameters"] = {{"rope_type", "default"},
                               {"rope_theta", 10000.0},
                               {"partial_rotary_factor", 0.5},
                               {"mrope_interleaved", true},
                               {"mrope_section", {2, 1, 1}}};
    const nlohmann::json c = {{"model_type", "qwen3_5"},
                              {"tie_word_embeddings", false},
                              {"vision_start_token_id", 120},
                              {"vision_end_token_id", 121},
                              {"image_token_id", 122},
                              {"video_token_id", 123},
                              {"text_config", text},
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
    return model::parse_model_config(c, "tiny qwen3_5");
  }
  nlohmann::json c = text_config(family, intermediate);
  c.update({{"tie_word_embeddings", false},
            {"vision_start_token_id", 120},
            {"vision_end_token_id", 121},
            {"vision_token_id", 119},
            {"image_token_id", 122},
            {"video_token_id", 123},
            {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}}},
            {"vision_config", qwen_vision}});
  return model::parse_model_config(c, "tiny " + family);
}

// Three sequences, 37 tokens in all (a tile of 5 leaves 2 over).
plan::Batch text_batch() {
  std::mt19937 rng(7);
  plan::Batch batch;
  for (int n : {11, 19, 7}) {
    plan::Sequence seq;
    for (int i = 0; i < n; ++i) seq.input_ids.push_back(std::uniform_int_distribution<int>(0, 99)(rng));
    batch.sequences.push_back(seq);
  }
  return batch;
}

struct Memory {
  int64_t mlp_tile = 0;  // 0, kAutoMlpTile or tokens
  bool recompute = false;
  bool offload = false;
};

struct Step {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> grads;
  int64_t tokens = 0;  // the rank's, as planned (the packer rounds 37 up)
  int64_t host_bytes_after_forward = 0, host_bytes_after_backward = 0;
};

Step run_step(const model::ModelConfig& config, const Memory& memory) {
  const plan::Batch batch = text_batch();
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, plan::PlanOptions{}, 0);
  const model::RankInputs in = model::rank_inputs(batch, whole);
  at::manual_seed(42);
  model::Decoder decoder(config.text, /*tie_word_embeddings=*/false);
  decoder.to(at::kDouble);
  const auto offload = memory.offload ? std::make_shared<model::ActivationOffload>() : nullptr;
  decoder.set_recompute_layers(memory.recompute, offload);
  decoder.set_mlp_tile(memory.mlp_tile);
  attention::AttentionOptions blocks;
  blocks.block_q = 8;
  blocks.block_k = 16;
  const model::DecoderContext ctx = parallel::decoder_context(in, config.text, config.conventions, {solo, solo}, blocks,
                                                              at::empty({0}, at::kDouble), /*linear_chunk=*/8);
  Step step;
  step.tokens = in.token_ids.size(0);
  Tensor loss = train::causal_lm_loss(decoder.forward(decoder.embed(in.token_ids), ctx), in.labels, in.label_count);
  if (offload) step.host_bytes_after_forward = offload->host_bytes();
  loss.backward();
  if (offload) step.host_bytes_after_backward = offload->host_bytes();
  step.loss = loss.item<double>();
  for (const auto& item : decoder.named_parameters()) step.grads.emplace_back(item.key(), item.value().grad());
  return step;
}

void expect_same(const Step& got, const Step& want, double rtol, const std::string& where) {
  EXPECT_NEAR(got.loss, want.loss, rtol * std::abs(want.loss)) << where;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << where;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    const auto& [name, w] = want.grads[i];
    ASSERT_TRUE(got.grads[i].second.defined()) << where << " " << name;
    if (rtol == 0) {
      EXPECT_TRUE(at::equal(got.grads[i].second, w)) << where << " " << name;
    } else {
      const double scale = w.abs().max().item<double>();
      const double off = (got.grads[i].second - w).abs().max().item<double>();
      EXPECT_LE(off, rtol * std::max(scale, 1e-30)) << where << " " << name << " scale " << scale;
    }
  }
}

TEST(TiledMlp, DecoderEqualsTheUntiledOneInFp64) {
  for (const char* family : {"qwen2_vl", "llava", "qwen3_5"}) {
    const model::ModelConfig config = decoder_config(family);
    const Step plain = run_step(config, {});
    for (int64_t tile : {int64_t{1}, int64_t{5}, int64_t{37}, int64_t{64}, model::kAutoMlpTile})
      for (bool recompute : {false, true}) {
        const std::string where =
            std::string(family) + " tile " + model::mlp_tile_name(tile) + (recompute ? " recomputed" : "");
        expect_same(run_step(config, {tile, recompute, false}), plain, 1e-12, where);
      }
  }
}

TEST(ActivationOffload, RecomputedDecoderIsBitwiseTheSameAndHostMemoryIsReturned) {
  for (const char* family : {"qwen2_vl", "qwen3_5"}) {
    const model::ModelConfig config = decoder_config(family);
    const Step recomputed = run_step(config, {0, true, false});
    const Step offloaded = run_step(config, {0, true, true});
    expect_same(offloaded, recomputed, 0, std::string(family) + " offloaded");
    // every layer's input [T, 32] in fp64 waited in the host store, and left it
    EXPECT_EQ(offloaded.host_bytes_after_forward, config.text.num_hidden_layers * offloaded.tokens * 32 * 8) << family;
    EXPECT_EQ(offloaded.host_bytes_after_backward, 0) << family;
    expect_same(run_step(config, {5, true, true}), recomputed, 1e-12, std::string(family) + " offloaded, tiled");
  }
}

TEST(ActivationOffload, NeedsRecomputedLayers) {
  const model::ModelConfig config = decoder_config("qwen2_vl");
  EXPECT_EQ(run_step(config, {0, false, false}).host_bytes_after_forward, 0);
}

// One MLP of 512 tokens and width 1024 (hidden 32): untiled, a step holds six [512, 1024]
// intermediates at its peak (24 MiB in fp64: the four the forward keeps, the backward's
// gradients); in tiles of 32 tokens, those of one tile, as the memory preflight counts
// them (measured here: 25.7 MB untiled, 2.9 MB in tiles of 32, 4.5 MB in tiles of 64).
TEST(TiledMlp, BackwardHoldsOneTilesIntermediate) {
  const int64_t T = 512, h = 32, I = 1024, tile = 32;
  at::manual_seed(3);
  const auto options = at::TensorOptions().dtype(at::kDouble);
  std::vector<Tensor> weights = {at::randn({I, h}, options).requires_grad_(), Tensor(),
                                 at::randn({I, h}, options).requires_grad_(), Tensor(),
                                 at::randn({h, I}, options).requires_grad_(), Tensor()};
  auto mlp = [](const Tensor& y, const std::vector<Tensor>& w) {
    return at::linear(at::silu(at::linear(y, w[0])) * at::linear(y, w[2]), w[4]);
  };
  const Tensor x = at::randn({T, h}, options).requires_grad_();
  // The step's peak above what was held before its forward (the weights and x).
  auto step_peak = [&](int64_t tile_tokens) {
    for (auto& w : weights)
      if (w.defined()) w.mutable_grad() = Tensor();
    x.mutable_grad() = Tensor();
    train::MemoryCounter counter;
    Tensor y = tile_tokens > 0 ? model::tiled_over_tokens(mlp, x, weights, tile_tokens) : mlp(x, weights);
    (y * y).sum().backward();
    return counter.peak_bytes();
  };
  const int64_t untiled = step_peak(0), tiled = step_peak(tile), tiled2 = step_peak(2 * tile);
  EXPECT_GE(untiled, 6 * T * I * 8) << "the untiled step holds its [T, I] intermediates";
  // In tiles: a tile's 4 kept and 3 backward intermediates, one weight's tile gradient
  // before it is summed and the input's gradient (the preflight's working set), besides
  // the weights' gradients and the step's own [T, h] tensors (y, y², their gradient).
  for (const auto& [tokens, peak] : {std::pair{tile, tiled}, std::pair{2 * tile, tiled2}}) {
    const int64_t bound = (7 * tokens * I + h * I + T * h) * 8 + 3 * I * h * 8 + 3 * T * h * 8;
    EXPECT_LE(peak, bound) << "tile " << tokens << ": peak " << peak << " B, untiled " << untiled << " B";
  }
  EXPECT_LE(tiled2 - tiled, 7 * tile * I * 8) << "a tile's intermediates grow with the tile";
  EXPECT_LT(tiled * 8, untiled);
}

TEST(TiledMlp, NoTokensGiveZeroGradientsAndSettingsParse) {
  const auto options = at::TensorOptions().dtype(at::kDouble);
  std::vector<Tensor> weights = {at::randn({8, 4}, options).requires_grad_()};
  const Tensor x = at::randn({0, 4}, options).requires_grad_();
  Tensor y = model::tiled_over_tokens([](const Tensor& t, const std::vector<Tensor>& w) { return at::linear(t, w[0]); },
                                      x, weights, 3);
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{0, 8}));
  y.sum().backward();
  ASSERT_TRUE(weights[0].grad().defined());
  EXPECT_EQ(weights[0].grad().abs().sum().item<double>(), 0.0);

  EXPECT_EQ(model::parse_mlp_tile("off"), 0);
  EXPECT_EQ(model::parse_mlp_tile("auto"), model::kAutoMlpTile);
  EXPECT_EQ(model::parse_mlp_tile("4096"), 4096);
  for (const char* bad : {"0", "-3", "12k", "", "auto2"}) {
    try {
      model::parse_mlp_tile(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("--tiled-mlp '" + std::string(bad) + "' must be off, auto"));
    }
  }
  // auto: tiles of at most the hidden size, equal: 10,000 tokens at width 3,584 → 3 tiles of 3,334
  EXPECT_EQ(model::mlp_tile_tokens(model::kAutoMlpTile, 10000, 3584), 3334);
  EXPECT_EQ(model::mlp_tile_tokens(model::kAutoMlpTile, 100, 3584), 100);
  EXPECT_EQ(model::mlp_tile_tokens(0, 100, 3584), 0);
  EXPECT_EQ(model::mlp_tile_tokens(7, 100, 3584), 7);
}

}  // namespace
