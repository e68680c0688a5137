// The mixture-of-experts MLP; see moe_block.h.
#include "mmsp/model/layers/moe_block.h"

#include <ATen/ATen.h>

#include <numeric>

#include "mmsp/core/check.h"
#include "mmsp/model/layers/activation.h"
#include "mmsp/model/layers/parameter_init.h"

namespace mmsp::model {

SwiGlu::SwiGlu(int64_t hidden, int64_t intermediate, double init_std, std::string act) : act_(std::move(act)) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(hidden, intermediate, false, init_std));
  up_proj = register_module("up_proj", std::make_shared<Linear>(hidden, intermediate, false, init_std));
  down_proj = register_module("down_proj", std::make_shared<Linear>(intermediate, hidden, false, init_std));
}

at::Tensor SwiGlu::forward(const at::Tensor& x) const {
  return down_proj->forward(activation(act_, gate_proj->forward(x)) * up_proj->forward(x));
}

SparseMoeBlock::SparseMoeBlock(const TextConfig& c) : moe_(c.moe), act_(c.hidden_act) {
  const MoeConfig& m = c.moe;
  MMSP_ASSERT(m.any() && m.num_experts % m.expert_shards == 0);
  const double s = c.initializer_range;
  const int64_t h = c.hidden_size, I = m.moe_intermediate_size, local = m.local_experts();
  gate = register_module("gate", std::make_shared<Linear>(h, m.num_experts, false, s));
  auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
  // Random weights: every expert is drawn and this rank's kept, so that a model's weights
  // are the same however many ranks split its experts (one process's, in the exactness
  // tests). Weights about to be loaded (or a meta skeleton) are made for this rank only.
  const int64_t first = m.first_local_expert();
  const bool draw_all = current_parameter_init() == ParameterInit::random && m.expert_shards > 1;
  const auto fused = [&](std::vector<int64_t> shape) {
    if (!draw_all) return normal_parameter(shape, s);
    shape[0] = m.num_experts;
    return normal_parameter(shape, s).narrow(0, first, local).clone();
  };
  if (m.layout == ExpertLayout::fused) {
    gate_up_proj_ = experts->register_parameter("gate_up_proj", fused({local, h, 2 * I}));
    down_proj_ = experts->register_parameter("down_proj", fused({local, I, h}));
  } else {
    for (int64_t e = draw_all ? 0 : first; e < (draw_all ? m.num_experts : first + local); ++e) {
      auto expert = std::make_shared<SwiGlu>(h, I, s, act_);
      if (e >= first && e < first + local) experts_.push_back(experts->register_module(std::to_string(e), expert));
    }
  }
  if (m.shared_expert_intermediate_size > 0) {
    shared_expert =
        register_module("shared_expert", std::make_shared<SwiGlu>(h, m.shared_expert_intermediate_size, s, act_));
    shared_expert_gate = register_module("shared_expert_gate", std::make_shared<Linear>(h, 1, false, s));
  }
}

at::Tensor SparseMoeBlock::local_experts(const at::Tensor& rows, const std::vector<int64_t>& counts) const {
  const int64_t local = moe_.local_experts();
  MMSP_ASSERT(local > 0 && static_cast<int64_t>(counts.size()) % local == 0, "counts of ", counts.size(),
              " (source, expert) blocks for ", local, " local experts");
  const int64_t sources = static_cast<int64_t>(counts.size()) / local;
  // Each expert's rows from every source, in source order; every expert runs, on no rows
  // if none came, so that its weights always get a (zero) gradient, as on one process.
  std::vector<std::vector<int64_t>> index(local);
  int64_t at = 0;
  for (int64_t s = 0; s < sources; ++s)
    for (int64_t j = 0; j < local; ++j)
      for (int64_t r = 0; r < counts[s * local + j]; ++r) index[j].push_back(at++);
  MMSP_ASSERT(at == rows.size(0), rows.size(0), " rows received for ", at, " counted");
  // unbind: one gradient for the whole fused tensor in the backward (stacked), not a
  // zero-padded one per expert.
  std::vector<at::Tensor> gate_up, down;
  if (gate_up_proj_.defined()) {
    gate_up = gate_up_proj_.unbind(0);
    down = down_proj_.unbind(0);
  }
  std::vector<at::Tensor> outputs;
  std::vector<int64_t> placed;
  for (int64_t j = 0; j < local; ++j) {
    const at::Tensor mine =
        rows.index_select(0, at::tensor(at::ArrayRef<int64_t>(index[j]), at::kLong).to(rows.device()));
    if (gate_up.empty()) {
      outputs.push_back(experts_[j]->forward(mine));
    } else {
      const int64_t I = moe_.moe_intermediate_size;
      const at::Tensor projected = mine.matmul(gate_up[j]);  // [n, 2I]: gate, then up
      outputs.push_back((activation(act_, projected.narrow(1, 0, I)) * projected.narrow(1, I, I)).matmul(down[j]));
    }
    placed.insert(placed.end(), index[j].begin(), index[j].end());
  }
  const at::Tensor by_expert = at::cat(outputs);
  if (sources == 1) return by_expert;  // already in the order received
  std::vector<int64_t> inverse(placed.size());
  for (size_t i = 0; i < placed.size(); ++i) inverse[placed[i]] = static_cast<int64_t>(i);
  return by_expert.index_select(0, at::tensor(at::ArrayRef<int64_t>(inverse), at::kLong).to(rows.device()));
}

at::Tensor SparseMoeBlock::forward(const at::Tensor& x, const MoeStep& step, int64_t sparse_layer) const {
  MMSP_CHECK(step.exchange.run || moe_.expert_shards == 1, "this model holds ", moe_.local_experts(), " of ",
             moe_.num_experts, " experts a layer (expert parallelism) but the step has no expert exchange");
  const int64_t L = x.size(0), E = moe_.num_experts, k = moe_.num_experts_per_tok;
  const at::Tensor logits = gate->forward(x);                   // [L, E]
  const at::Tensor probs = at::softmax(logits, 1, at::kFloat);  // float32, as transformers' router
  const auto top = at::topk(probs, k, 1);
  const at::Tensor top_w = std::get<0>(top), top_i = std::get<1>(top);  // [L, k]
  const at::Tensor weights = (top_w / top_w.sum(1, true)).to(x.scalar_type());
  // The (token, pick) pairs by expert, then token: each rank's experts get their rows in
  // that order, and each token's outputs come back summed in the experts' order.
  const at::Tensor picked = top_i.reshape({-1});  // [L·k]: token t's picks at t·k ...
  const at::Tensor token_of = at::arange(L, picked.options()).repeat_interleave(k);
  const at::Tensor order = at::argsort(picked * L + token_of);  // keys are distinct
  const at::Tensor tokens = token_of.index_select(0, order);
  const at::Tensor per_expert = at::bincount(picked, {}, E).to(at::kCPU);
  std::vector<int64_t> counts(per_expert.data_ptr<int64_t>(), per_expert.data_ptr<int64_t>() + E);
  const at::Tensor rows = x.index_select(0, tokens);
  const LocalExperts here = [this](const at::Tensor& r, const std::vector<int64_t>& c) { return local_experts(r, c); };
  const at::Tensor outputs = step.exchange.run ? step.exchange.run(rows, counts, here) : here(rows, counts);
  const at::Tensor weighted = outputs * weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  at::Tensor out = at::zeros_like(x).index_add(0, tokens, weighted);
  if (shared_expert) out = out + at::sigmoid(shared_expert_gate->forward(x)) * shared_expert->forward(x);
  if (!step.load) return out;
  // The step's statistics over the real tokens: picks, and (aux loss) the probabilities in
  // float64 for a float64 model (transformers' load_balancing_loss_func softmaxes in the
  // logits' dtype), else float32.
  const at::Tensor real = step.real.to(x.device());
  const at::Tensor real_picks = at::bincount(top_i.index_select(0, real).reshape({-1}), {}, E);
  at::Tensor prob_sum;
  if (moe_.aux_loss())
    prob_sum = (logits.scalar_type() == at::kDouble ? at::softmax(logits, 1) : probs).index_select(0, real).sum(0);
  return step.load->record(sparse_layer, out, real_picks, prob_sum);
}

}  // namespace mmsp::model
