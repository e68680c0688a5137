// The decoder under sequence parallelism equals one process: a packed text batch,
// planned for every mesh of the world (dp × ring × ulysses), run on every rank with
// the same weights; the loss summed over ranks and every parameter gradient summed
// over ranks equal the single-process run on the whole batch (fp64, rtol 1e-9).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <random>

#include "mmsp/model/config/config.h"
#include "mmsp/model/layers/decoder.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/parallel/decoder_attention.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "multirank.h"
#include "sp_compare.h"

using namespace mmsp;
using at::Tensor;

namespace {

// A Qwen2-VL decoder (mRoPE, q/k/v biases) or LLaVA's Llama decoder (1-D RoPE, no biases).
model::ModelConfig tiny_config(const std::string& model_type) {
  if (model_type == "llava") {
    nlohmann::json c = {{"model_type", "llava"},
                        {"image_token_index", 122},
                        {"image_seq_length", 16},
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
                          {"num_hidden_layers", 1},
                          {"num_attention_heads", 2},
                          {"image_size", 8},
                          {"patch_size", 2},
                          {"projection_dim", 16},
                          {"hidden_act", "quick_gelu"},
                          {"layer_norm_eps", 1e-5}}}};
    return model::parse_model_config(c, "tiny llava");
  }
  nlohmann::json c = {{"model_type", model_type},
                      {"vocab_size", 128},
                      {"hidden_size", 96},
                      {"intermediate_size", 64},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 12},
                      {"num_key_value_heads", 2},
                      {"rope_theta", 10000.0},
                      {"rms_norm_eps", 1e-6},
                      {"tie_word_embeddings", false},
                      {"vision_start_token_id", 120},
                      {"vision_end_token_id", 121},
                      {"vision_token_id", 119},
                      {"image_token_id", 122},
                      {"video_token_id", 123},
                      {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}}},
                      {"vision_config",
                       {{"depth", 1},
                        {"embed_dim", 16},
                        {"hidden_size", 96},
                        {"num_heads", 2},
                        {"mlp_ratio", 2},
                        {"patch_size", 2},
                        {"spatial_merge_size", 2},
                        {"temporal_patch_size", 2},
                        {"in_chans", 3}}}};
  return model::parse_model_config(c, "tiny " + model_type);
}

plan::Batch text_batch(std::mt19937& rng) {
  plan::Batch batch;
  for (int s = 0; s < 5; ++s) {
    plan::Sequence seq;
    const int n = std::uniform_int_distribution<int>(2, 37)(rng);
    for (int i = 0; i < n; ++i) seq.input_ids.push_back(std::uniform_int_distribution<int>(0, 99)(rng));
    batch.sequences.push_back(seq);
  }
  return batch;
}

// One step of `plan` on this rank; gradients and loss summed over `world`.
test::StepResult run(const model::ModelConfig& config, const plan::Batch& batch, const plan::StepPlan& plan,
                     const attention::ContextGroups& groups, const dist::GroupPtr& world) {
  at::manual_seed(42);  // identical replicas
  auto decoder = std::make_shared<model::Decoder>(config.text, config.tie_word_embeddings);
  decoder->to(at::kDouble);
  model::RankInputs in = model::rank_inputs(batch, plan);
  attention::AttentionOptions blocks;
  blocks.block_q = 8;
  blocks.block_k = 16;
  const model::DecoderContext ctx =
      parallel::decoder_context(in, config.text, config.conventions, groups, blocks, at::empty({0}, at::kDouble));
  Tensor logits = decoder->forward(decoder->embed(in.token_ids), ctx);
  Tensor loss = train::causal_lm_loss(logits, in.labels, in.label_count);
  loss.backward();
  return test::summed_over(*decoder, loss, world);
}

}  // namespace

TEST(MultiRank, DecoderLossAndEveryGradientEqualOneProcess) {
  for (const std::string model_type : {"qwen2_vl", "llava"}) {
    const model::ModelConfig config = tiny_config(model_type);
    std::mt19937 rng(5);
    const plan::Batch batch = text_batch(rng);
    const dist::GroupPtr solo = dist::make_solo_group("solo", 0);

    plan::PlanOptions single;
    const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, single, 0);
    const test::StepResult ref = run(config, batch, whole, {solo, solo}, solo);

    for (const dist::Mesh& mesh : test::all_meshes()) {
      const int U = mesh.shape().ulysses;
      if (U == 3) continue;  // 2 K/V heads cannot be shared by 3 ulysses ranks (an error, tested in test_attention)
      plan::PlanOptions options;
      options.mesh = mesh.shape();
      const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
      const test::StepResult got = run(config, batch, mine, {mesh.ring(), mesh.ulysses()}, mesh.world());
      test::expect_same_step(got, ref, 1e-9, model_type + " " + mesh.shape().str());
    }
  }
}

// The names are Hugging Face's, so checkpoints move both ways.
TEST(DecoderNames, AreHuggingFaceNames) {
  const model::ModelConfig config = tiny_config("qwen2_vl");
  model::Decoder decoder(config.text, false);
  std::vector<std::string> names;
  for (const auto& item : decoder.named_parameters()) names.push_back(item.key());
  const std::vector<std::string> expected_prefix = {
      "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.q_proj.bias"};
  for (const auto& name : expected_prefix) EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  for (const char* name : {"model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight",
                           "model.layers.1.self_attn.o_proj.weight", "model.layers.1.post_attention_layernorm.weight"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  EXPECT_EQ(std::find(names.begin(), names.end(), "model.layers.0.self_attn.o_proj.bias"), names.end());
}

namespace {

// Records the hooks' calls; keeps the head weight's dense gradient as it stands at the
// head's after_backward, and the lookup's rows.
class RecordingHooks : public model::LayerHooks {
 public:
  RecordingHooks(const Tensor& head_weight, size_t head_unit) : weight_(head_weight), head_(head_unit) {}
  void before_forward(size_t unit) override { calls.push_back("F" + std::to_string(unit)); }
  void after_forward(size_t) override {}
  void before_backward(size_t unit) override { calls.push_back("B" + std::to_string(unit)); }
  void after_backward(size_t unit) override {
    calls.push_back("b" + std::to_string(unit));
    if (unit == head_ && weight_.grad().defined()) head_grad = weight_.grad().clone();
  }
  void lookup_backward(size_t unit, const Tensor& ids, const Tensor& rows) override {
    calls.push_back("L" + std::to_string(unit));
    lookup_ids = ids, lookup_rows = rows;
  }
  std::vector<std::string> calls;
  Tensor head_grad, lookup_ids, lookup_rows;

 private:
  Tensor weight_;
  size_t head_;
};

}  // namespace

// With hooks, the lookup of a head tied to the embedding hands its gradient over as
// rows and keeps no autograd edge to the weight: the head's dense gradient is complete
// at the head's own after_backward, before any layer's backward (ZeRO reduces and frees
// it there; an edge would have autograd hold it to the end of the backward), and that
// part plus the rows added at their token ids is the one-process gradient.
TEST(DecoderHooks, TiedLookupGivesRowsAndTheHeadGradientIsCompleteAtItsHook) {
  const model::ModelConfig config = tiny_config("qwen2_vl");
  std::mt19937 rng(11);
  const plan::Batch batch = text_batch(rng);
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, plan::PlanOptions{}, 0);
  const model::RankInputs in = model::rank_inputs(batch, whole);
  auto step = [&](const std::shared_ptr<RecordingHooks>& hooks, model::Decoder& decoder) {
    const model::DecoderContext ctx = parallel::decoder_context(
        in, config.text, config.conventions, {solo, solo}, attention::AttentionOptions{}, at::empty({0}, at::kDouble));
    decoder.set_layer_hooks(hooks);
    Tensor logits = decoder.forward(decoder.embed(in.token_ids), ctx);
    train::causal_lm_loss(logits, in.labels, in.label_count).backward();
  };
  at::manual_seed(42);
  model::Decoder ref(config.text, /*tie_word_embeddings=*/true);
  ref.to(at::kDouble);
  step(nullptr, ref);
  at::manual_seed(42);
  model::Decoder hooked(config.text, true);
  hooked.to(at::kDouble);
  auto hooks = std::make_shared<RecordingHooks>(hooked.head_weight(), /*head_unit=*/2);
  step(hooks, hooked);

  // the lookup and the head are unit 2 (2 layers): lookup, layers, loss; then the
  // backward in reverse, the lookup's rows last
  EXPECT_EQ(hooks->calls, (std::vector<std::string>{"F2", "F0", "F1", "F2", "B2", "b2", "B1", "b1", "B0", "b0", "L2"}));
  ASSERT_TRUE(hooks->head_grad.defined()) << "the head's dense gradient is not complete at its after_backward";
  EXPECT_TRUE(at::equal(hooked.head_weight().grad(), hooks->head_grad)) << "no dense gradient after the head's";
  ASSERT_TRUE(hooks->lookup_rows.defined());
  EXPECT_TRUE(at::equal(hooks->lookup_ids, in.token_ids.reshape({-1})));
  EXPECT_GT(hooks->lookup_rows.abs().max().item<double>(), 0.0);
  const Tensor total = hooks->head_grad.index_add(0, hooks->lookup_ids, hooks->lookup_rows);
  EXPECT_TRUE(at::allclose(total, ref.head_weight().grad(), 1e-12, 1e-14));
  const auto want = ref.named_parameters(), got = hooked.named_parameters();
  for (const auto& item : want)
    if (item.key() != "model.embed_tokens.weight") {
      EXPECT_TRUE(at::allclose(got[item.key()].grad(), item.value().grad(), 1e-12, 1e-14)) << item.key();
    }
}
