// The decoder under sequence parallelism equals one process: a packed text batch,
// planned for every mesh of the world (dp × ring × ulysses), run on every rank with
// the same weights; the loss summed over ranks and every parameter gradient summed
// over ranks equal the single-process run on the whole batch (fp64, rtol 1e-9).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <random>

#include "mmsp/dist/all_reduce.h"
#include "mmsp/model/config.h"
#include "mmsp/model/decoder.h"
#include "mmsp/model/rank_inputs.h"
#include "multirank.h"

using namespace mmsp;
using at::Tensor;

namespace {

model::ModelConfig tiny_config(const std::string& model_type) {
  nlohmann::json c = {
      {"model_type", model_type}, {"vocab_size", 128}, {"hidden_size", 96},
      {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 12},
      {"num_key_value_heads", 2}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6},
      {"tie_word_embeddings", false}, {"vision_start_token_id", 120}, {"vision_end_token_id", 121},
      {"vision_token_id", 119}, {"image_token_id", 122}, {"video_token_id", 123},
      {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}}},
      {"vision_config", {{"depth", 1}, {"embed_dim", 16}, {"hidden_size", 96}, {"num_heads", 2},
                         {"mlp_ratio", 2}, {"patch_size", 2}, {"spatial_merge_size", 2},
                         {"temporal_patch_size", 2}, {"in_chans", 3}}}};
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

struct Result {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> grads;
};

// One step of `plan` on this rank; gradients and loss summed over `world`.
Result run(const model::ModelConfig& config, const plan::Batch& batch, const plan::StepPlan& plan,
           const attention::ContextGroups& groups, const dist::GroupPtr& world) {
  at::manual_seed(42);  // identical replicas
  auto decoder = std::make_shared<model::Decoder>(config.text, config.tie_word_embeddings);
  decoder->to(at::kDouble);
  model::RankInputs in = model::rank_inputs(batch, plan);
  model::DecoderContext ctx;
  ctx.groups = groups;
  ctx.ring_shares = in.ring_shares;
  ctx.rotary = model::rotary_table(in.positions, model::rotary_options(config.text, config.conventions),
                                   at::kDouble, at::kCPU);
  ctx.attention.block_q = 8;
  ctx.attention.block_k = 16;
  Tensor logits = decoder->forward(decoder->embed(in.token_ids), ctx);
  Tensor loss = model::causal_lm_loss(logits, in.labels, in.label_count);
  loss.backward();
  Result r;
  Tensor total = loss.detach().reshape({1});
  dist::all_reduce_(total, *world);
  r.loss = total.item<double>();
  for (const auto& item : decoder->named_parameters()) {
    Tensor g = item.value().grad().clone();
    dist::all_reduce_(g, *world);
    r.grads.emplace_back(item.key(), g);
  }
  return r;
}

// The k_proj bias gets a gradient that is zero in exact arithmetic (softmax ignores a
// constant shift of the scores): compare it against a floor of 1e-12 of the model's
// largest gradient instead of its own rounding noise.
void expect_same(const Result& got, const Result& ref, const std::string& where) {
  EXPECT_NEAR(got.loss, ref.loss, 1e-9 * std::abs(ref.loss)) << where << " loss";
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  double model_scale = 0;
  for (const auto& [name, g] : ref.grads) model_scale = std::max(model_scale, g.abs().max().item<double>());
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].first, ref.grads[i].first);
    const double scale = ref.grads[i].second.abs().max().item<double>();
    const double diff = (got.grads[i].second - ref.grads[i].second).abs().max().item<double>();
    EXPECT_LE(diff, 1e-9 * (scale + 1e-3 * model_scale)) << where << " gradient of " << ref.grads[i].first;
  }
}

}  // namespace

TEST(MultiRank, DecoderLossAndEveryGradientEqualOneProcess) {
  for (const std::string model_type : {"qwen2_vl", "llava_text"}) {
    if (model_type == "llava_text") continue;  // LLaVA needs its CLIP config; covered by the VLM test
    const model::ModelConfig config = tiny_config(model_type);
    std::mt19937 rng(5);
    const plan::Batch batch = text_batch(rng);
    const dist::GroupPtr solo = dist::make_solo_group("solo", 0);

    plan::PlanOptions single;
    const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, single, 0);
    const Result ref = run(config, batch, whole, {solo, solo}, solo);

    for (const dist::Mesh& mesh : test::all_meshes()) {
      const int U = mesh.shape().ulysses;
      if (U == 3) continue;  // 2 K/V heads cannot be shared by 3 ulysses ranks (an error, tested in test_attention)
      plan::PlanOptions options;
      options.mesh = mesh.shape();
      const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
      const Result got = run(config, batch, mine, {mesh.ring(), mesh.ulysses()}, mesh.world());
      expect_same(got, ref, model_type + " " + mesh.shape().str());
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
      "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias"};
  for (const auto& name : expected_prefix)
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  for (const char* name : {"model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight",
                           "model.layers.1.self_attn.o_proj.weight", "model.layers.1.post_attention_layernorm.weight"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  EXPECT_EQ(std::find(names.begin(), names.end(), "model.layers.0.self_attn.o_proj.bias"), names.end());
}
