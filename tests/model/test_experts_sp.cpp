// The mixture-of-experts layer (model/layers/moe_block.h) on one process against a reference
// written in the test from transformers' Qwen3VLMoeTextSparseMoeBlock and
// Qwen3_5MoeSparseMoeBlock (router softmax in float32, top-k renormalised, the experts'
// loop adding each one's weighted output in expert order, the shared expert's sigmoid
// gate), both weight layouts, every gradient; the step's auxiliary loss against
// transformers' load_balancing_loss_func written out. Under mmsp-run, the expert exchange
// (parallel/expert_parallel.h) on every expert group of the world: each row lands on its
// expert's rank in the documented order and comes back to its place, its gradient too, and
// the bytes the group counts equal the formula.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "mmsp/dist/mesh.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/layers/moe_block.h"
#include "mmsp/parallel/expert_parallel.h"
#include "multirank.h"

using namespace mmsp;
using at::Tensor;

namespace {

// A text config of 8 experts, top 2, width 16 (shared expert 12 when asked), in a layout.
model::TextConfig moe_text(model::ExpertLayout layout, bool shared) {
  model::TextConfig t;
  t.hidden_size = 16;
  t.hidden_act = "silu";
  t.num_hidden_layers = 1;
  t.moe.num_experts = 8;
  t.moe.num_experts_per_tok = 2;
  t.moe.moe_intermediate_size = 6;
  t.moe.shared_expert_intermediate_size = shared ? 12 : 0;
  t.moe.layout = layout;
  t.moe.output_router_logits = true;
  t.moe.router_aux_loss_coef = 0.5;
  return t;
}

// transformers' block, written out: softmax(x gateᵀ) in float32, top k, / their sum, to
// x's dtype; for each expert in order, its tokens' SwiGLU times their weight, index-added.
Tensor reference_block(const model::SparseMoeBlock& block, const Tensor& x, const model::TextConfig& t,
                       const std::vector<std::array<Tensor, 3>>& experts) {
  const auto params = block.named_parameters();
  const Tensor probs = at::softmax(at::linear(x, params["gate.weight"]).to(at::kFloat), 1);
  auto [top_w, top_i] = at::topk(probs, t.moe.num_experts_per_tok, 1);
  top_w = (top_w / top_w.sum(1, true)).to(x.scalar_type());
  Tensor out = at::zeros_like(x);
  for (int64_t e = 0; e < t.moe.num_experts; ++e) {
    const Tensor hit = (top_i == e).nonzero();  // [n, 2]: token, pick
    if (hit.size(0) == 0) continue;
    const Tensor tokens = hit.select(1, 0), picks = hit.select(1, 1);
    const Tensor h = x.index_select(0, tokens);
    const Tensor y = at::linear(at::silu(at::linear(h, experts[e][0])) * at::linear(h, experts[e][1]), experts[e][2]);
    out = out.index_add(0, tokens, y * top_w.index({tokens, picks}).unsqueeze(1));
  }
  if (t.moe.shared_expert_intermediate_size > 0) {
    const Tensor s = at::linear(at::silu(at::linear(x, params["shared_expert.gate_proj.weight"])) *
                                    at::linear(x, params["shared_expert.up_proj.weight"]),
                                params["shared_expert.down_proj.weight"]);
    out = out + at::sigmoid(at::linear(x, params["shared_expert_gate.weight"])) * s;
  }
  return out;
}

// Each expert's (gate [I, h], up [I, h], down [h, I]) as views of the block's parameters.
std::vector<std::array<Tensor, 3>> expert_weights(const model::SparseMoeBlock& block, const model::TextConfig& t) {
  const auto params = block.named_parameters();
  std::vector<std::array<Tensor, 3>> out;
  const int64_t I = t.moe.moe_intermediate_size;
  for (int64_t e = 0; e < t.moe.num_experts; ++e) {
    if (t.moe.layout == model::ExpertLayout::fused) {
      const Tensor gu = params["experts.gate_up_proj"][e], down = params["experts.down_proj"][e];  // [h, 2I], [I, h]
      out.push_back({gu.narrow(1, 0, I).t(), gu.narrow(1, I, I).t(), down.t()});
    } else {
      const std::string p = "experts." + std::to_string(e) + ".";
      out.push_back({params[p + "gate_proj.weight"], params[p + "up_proj.weight"], params[p + "down_proj.weight"]});
    }
  }
  return out;
}

}  // namespace

TEST(MoeBlock, EqualsTransformersBlockAndEveryGradientInBothLayouts) {
  for (const auto layout : {model::ExpertLayout::fused, model::ExpertLayout::per_expert}) {
    const bool shared = layout == model::ExpertLayout::per_expert;  // Qwen3.5-MoE's has one
    const model::TextConfig t = moe_text(layout, shared);
    at::manual_seed(3);
    model::SparseMoeBlock block(t);
    block.to(at::kDouble);
    const Tensor x = at::randn({37, 16}, at::kDouble).requires_grad_();
    const Tensor got = block.forward(x, {}, 0);
    const Tensor weight = at::randn_like(got);
    (got * weight).sum().backward();
    std::vector<Tensor> ours;
    for (const auto& p : block.parameters()) ours.push_back(p.grad().clone()), p.mutable_grad().reset();
    const Tensor dx = x.grad().clone();
    x.mutable_grad().reset();
    const Tensor want = reference_block(block, x, t, expert_weights(block, t));
    (want * weight).sum().backward();
    EXPECT_TRUE(at::allclose(got, want, 1e-12, 1e-14)) << (got - want).abs().max().item<double>();
    EXPECT_TRUE(at::allclose(dx, x.grad(), 1e-12, 1e-14));
    size_t i = 0;
    for (const auto& item : block.named_parameters()) {
      EXPECT_TRUE(at::allclose(ours[i], item.value().grad(), 1e-12, 1e-14)) << item.key();
      ++i;
    }
  }
}

// transformers' load_balancing_loss_func over one layer's router logits of 2 × 9 tokens
// split over two "ranks" (the second with 2 padding slots): E · Σ_e (C_e / N)(P_e / N),
// and its gradient by the router's weight, from the two ranks' shares summed.
TEST(MoeBlock, AuxiliaryLossIsTransformersOverTheRealTokensOfEveryRank) {
  const model::TextConfig t = moe_text(model::ExpertLayout::per_expert, false);
  at::manual_seed(4);
  model::SparseMoeBlock block(t);
  block.to(at::kDouble);
  const Tensor x = at::randn({20, 16}, at::kDouble);
  const Tensor real_slots = at::cat({at::arange(0, 9), at::arange(11, 20)});  // slots 9, 10: padding
  // The two ranks' shares (rank 0: slots 0-9, rank 1: slots 10-19), their counts summed.
  std::vector<std::shared_ptr<model::RouterLoad>> loads;
  std::vector<Tensor> outs;
  for (int r = 0; r < 2; ++r) {
    const Tensor mine = x.narrow(0, 10 * r, 10);
    const Tensor real = r == 0 ? at::arange(0, 9) : at::arange(1, 10);
    loads.push_back(std::make_shared<model::RouterLoad>(8, 1, 0.5, real.numel()));
    outs.push_back(block.forward(mine, {{}, real, loads.back()}, 0));
  }
  at::Tensor summed;
  for (auto& l : loads) {
    // every rank's counts and real tokens, as the all-reduce gives them
    l->finish([&](at::Tensor& mine) {
      if (!summed.defined()) {
        summed = mine.clone();
      } else {
        summed = summed + mine;
      }
    });
  }
  // finish() above saw partial sums; redo with the full sum on each.
  loads.clear();
  outs.clear();
  double share_total = 0;
  for (int r = 0; r < 2; ++r) {
    const Tensor mine = x.narrow(0, 10 * r, 10);
    const Tensor real = r == 0 ? at::arange(0, 9) : at::arange(1, 10);
    loads.push_back(std::make_shared<model::RouterLoad>(8, 1, 0.5, real.numel()));
    outs.push_back(block.forward(mine, {{}, real, loads.back()}, 0));
    share_total += loads.back()->finish([&](at::Tensor& c) { c.copy_(summed); });
  }
  (outs[0].sum() * 0 + outs[1].sum() * 0).backward();  // only the aux loss's gradient reaches the router
  const Tensor ours = block.gate->weight.grad().clone();
  block.gate->weight.mutable_grad().reset();
  // transformers: softmax over the real tokens' logits, top-2 counts, E · Σ tokens_per_expert · router_prob.
  const Tensor logits = at::linear(x.index_select(0, real_slots), block.gate->weight);
  const Tensor p = at::softmax(logits, 1);
  const Tensor picks = at::one_hot(std::get<1>(at::topk(p, 2, 1)), 8).sum({0, 1}).to(at::kDouble);
  const Tensor aux = 8 * (picks / 18 * p.mean(0)).sum() * 0.5;
  EXPECT_NEAR(share_total, aux.item<double>(), 1e-14 * aux.item<double>());
  aux.backward();
  EXPECT_TRUE(at::allclose(ours, block.gate->weight.grad(), 1e-12, 1e-16))
      << (ours - block.gate->weight.grad()).abs().max().item<double>();
}

// Rows to their experts' ranks and back over every expert group of the world: row i of this
// rank for local expert j of rank d holds (rank, d, j, i) in its four columns; the experts
// check each row's origin and order and scale it by (1 + their rank); the rows come back to
// their places scaled so, and their gradients the same way. The group's counters: to the
// experts and back, each row sent elsewhere once each way (h · 8 bytes), plus the counts'
// all-to-all (8 bytes per (rank, expert) pair sent elsewhere); the backward the same.
TEST(MultiRankExperts, ExchangeSendsEveryRowToItsExpertAndBackWithTheFormulasBytes) {
  const int world = test::rank_env().world_size;
  for (int ranks = 2; ranks <= world; ranks *= 2) {
    if (world % ranks) continue;
    const dist::Mesh mesh = test::make_mesh(plan::Mesh{world, 1, 1, ranks});
    const model::ExpertExchange exchange = parallel::expert_exchange(mesh.expert());
    const int64_t me = mesh.expert()->rank(), local = 2, h = 4;
    std::vector<int64_t> counts;
    std::vector<Tensor> blocks;
    for (int64_t d = 0; d < ranks; ++d)
      for (int64_t j = 0; j < local; ++j) {
        const int64_t n = (me + 2 * d + j) % 3;  // uneven, some empty
        counts.push_back(n);
        for (int64_t i = 0; i < n; ++i)
          blocks.push_back(at::tensor({double(me), double(d), double(j), double(i)}, at::kDouble).view({1, h}));
      }
    const Tensor rows = (blocks.empty() ? at::zeros({0, h}, at::kDouble) : at::cat(blocks)).requires_grad_();
    const model::LocalExperts experts = [&](const Tensor& got, const std::vector<int64_t>& c) {
      int64_t at = 0;
      for (int64_t s = 0; s < ranks; ++s)
        for (int64_t j = 0; j < local; ++j)
          for (int64_t i = 0; i < c[s * local + j]; ++i, ++at) {
            const Tensor row = got[at];
            EXPECT_EQ(row[0].item<double>(), s);
            EXPECT_EQ(row[1].item<double>(), me);
            EXPECT_EQ(row[2].item<double>(), j);
            EXPECT_EQ(row[3].item<double>(), i);
          }
      EXPECT_EQ(at, got.size(0));
      return got * double(1 + me);
    };
    const dist::CommSnapshot before = mesh.stats().snapshot(plan::MeshAxis::expert);
    const Tensor back = exchange.run(rows, counts, experts);
    (back * 3).sum().backward();
    const int64_t sent = mesh.stats().snapshot(plan::MeshAxis::expert).total_bytes() - before.total_bytes();
    Tensor scale = at::empty({rows.size(0), 1}, at::kDouble);
    int64_t at = 0, elsewhere = 0;
    for (int64_t d = 0; d < ranks; ++d)
      for (int64_t j = 0; j < local; ++j)
        for (int64_t i = 0; i < counts[d * local + j]; ++i, ++at) {
          scale[at][0] = double(1 + d);
          elsewhere += d != me;
        }
    EXPECT_TRUE(back.equal(rows.detach() * scale)) << "ranks " << ranks;
    EXPECT_TRUE(rows.grad().equal(3 * scale.expand({rows.size(0), h}))) << "ranks " << ranks;
    // Rows this rank receives from elsewhere, counted by the senders' formula (c = (s + 2·me + j) % 3).
    int64_t received = 0;
    for (int64_t s = 0; s < ranks; ++s)
      for (int64_t j = 0; j < local; ++j) received += s != me ? (s + 2 * me + j) % 3 : 0;
    const int64_t forward = (elsewhere + received) * h * 8 + 8 * local * (ranks - 1);
    EXPECT_EQ(sent, forward + (elsewhere + received) * h * 8) << "ranks " << ranks;  // backward: the rows again
  }
}
