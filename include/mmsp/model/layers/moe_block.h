// The mixture-of-experts MLP of Qwen3-VL-MoE and Qwen3.5-MoE (transformers'
// Qwen3VLMoeTextSparseMoeBlock, Qwen3_5MoeSparseMoeBlock) under their checkpoints' names:
// mlp.gate.weight [E, hidden] (the router), the experts in the family's layout
// (moe_config.h: mlp.experts.gate_up_proj / down_proj, or mlp.experts.<e>.*_proj.weight),
// and Qwen3.5-MoE's mlp.shared_expert.{gate,up,down}_proj.weight with
// mlp.shared_expert_gate.weight [1, hidden]. As transformers: the router's softmax in
// float32 whatever the dtype, its top k renormalised to sum to 1 and rounded to the
// model's dtype; each expert a SwiGLU, its output times its weight; a token's k outputs
// summed in the order of the experts' indices (transformers' loop over experts); plus
// sigmoid(shared_expert_gate(x)) · shared_expert(x). Dropless: every token reaches its k
// experts. Where the experts are is the step's (expert_exchange.h): this block holds
// experts [first, first + E_l) (MoeConfig::expert_shard) and runs them on the rows the
// exchange brings from the expert group.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "mmsp/model/config/text_config.h"
#include "mmsp/model/layers/expert_exchange.h"
#include "mmsp/model/layers/linear.h"
#include "mmsp/model/layers/router_load.h"

namespace mmsp::model {

// A step's mixture-of-experts context, the same for every sparse layer.
struct MoeStep {
  ExpertExchange exchange;           // how tokens reach their experts' ranks
  at::Tensor real;                   // bool [L]: slots that hold a token (padding is not counted)
  std::shared_ptr<RouterLoad> load;  // the step's routing counts and aux loss; null: not recorded
};

// down(act(gate(x)) · up(x)), no biases: an expert of the per-expert layout, the shared expert.
class SwiGlu : public torch::nn::Module {
 public:
  SwiGlu(int64_t hidden, int64_t intermediate, double init_std, std::string act);
  at::Tensor forward(const at::Tensor& x) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;

 private:
  std::string act_;
};

class SparseMoeBlock : public torch::nn::Module {
 public:
  explicit SparseMoeBlock(const TextConfig& config);
  // x [L, hidden] (the post-attention norm's output) -> [L, hidden]; `sparse_layer`: this
  // layer's place among the decoder's sparse layers (RouterLoad's index).
  at::Tensor forward(const at::Tensor& x, const MoeStep& step, int64_t sparse_layer) const;

  std::shared_ptr<Linear> gate;                // the router
  std::shared_ptr<SwiGlu> shared_expert;       // Qwen3.5-MoE; else null
  std::shared_ptr<Linear> shared_expert_gate;  // [1, hidden] with the shared expert

 private:
  // Local expert j (expert first + j) on its rows [n, hidden] -> [n, hidden].
  at::Tensor expert(int64_t j, const at::Tensor& rows) const;
  // Every local expert on the rows the exchange brought (expert_exchange.h's LocalExperts).
  at::Tensor local_experts(const at::Tensor& rows, const std::vector<int64_t>& counts) const;

  MoeConfig moe_;
  std::string act_;
  at::Tensor gate_up_proj_, down_proj_;           // fused: [E_l, hidden, 2I], [E_l, I, hidden]
  std::vector<std::shared_ptr<SwiGlu>> experts_;  // per expert: experts.<first + j>
};

}  // namespace mmsp::model
