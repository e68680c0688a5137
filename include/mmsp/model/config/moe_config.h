// A decoder's mixture-of-experts MLP, as transformers' Qwen3-VL-MoE and Qwen3.5-MoE text
// configs describe it: which layers are sparse (num_experts, decoder_sparse_step,
// mlp_only_layers), the router's top-k, the experts' and the shared expert's widths, the
// auxiliary load-balancing loss, and how the family's checkpoints lay the experts out.
// Which experts a model holds (expert parallelism) is not config.json's: the caller sets
// it before building (expert_shards, expert_shard).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mmsp::model {

// How a family's checkpoints store the experts of one layer.
enum class ExpertLayout {
  // Qwen3-VL-MoE's released files: mlp.experts.gate_up_proj [E, hidden, 2I] (gate columns
  // first) and mlp.experts.down_proj [E, I, hidden]: x @ gate_up, then @ down
  fused,
  // Qwen3.5-MoE's (and Qwen3-Next's): mlp.experts.<e>.{gate,up,down}_proj.weight, Linear's [out, in]
  per_expert,
};

struct MoeConfig {
  // experts of a sparse layer (num_experts); 0: every layer's MLP is dense
  int64_t num_experts = 0;
  // experts each token is routed to (num_experts_per_tok), k
  int64_t num_experts_per_tok = 0;
  // width I of each expert's SwiGLU (moe_intermediate_size)
  int64_t moe_intermediate_size = 0;
  // width of the shared expert every token also goes through, gated by sigmoid(shared_expert_gate(x))
  // (Qwen3.5-MoE: shared_expert_intermediate_size); 0: none (Qwen3-VL-MoE)
  int64_t shared_expert_intermediate_size = 0;
  // layer i is sparse iff (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // the auxiliary load-balancing loss (Switch Transformer's, over every sparse layer's
  // routing of the step's tokens), added times this coefficient when output_router_logits
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
  ExpertLayout layout = ExpertLayout::per_expert;

  // Expert parallelism (not config.json's; set by the caller before building): the experts
  // are split into expert_shards equal blocks and this model holds block expert_shard.
  int64_t expert_shards = 1;
  int64_t expert_shard = 0;

  bool any() const { return num_experts > 0; }
  bool sparse(int64_t layer) const;
  int64_t local_experts() const { return num_experts / expert_shards; }
  int64_t first_local_expert() const { return expert_shard * local_experts(); }
  bool aux_loss() const { return any() && output_router_logits && router_aux_loss_coef != 0; }
};

// transformers' defaults of a family's MoE text config, and whether it has the shared expert.
struct MoeDefaults {
  int64_t num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
  ExpertLayout layout;
  // decoder_sparse_step and mlp_only_layers are read (Qwen3-VL-MoE); Qwen3.5-MoE's config has
  // neither (every layer is sparse) and refuses them
  bool reads_sparse_step;
};

// Reads and checks the MoE fields of `text` (errors name where + the key and the value):
// 1 <= num_experts_per_tok <= num_experts, widths >= 1, decoder_sparse_step >= 1,
// mlp_only_layers within [0, layers), a finite router_aux_loss_coef >= 0, norm_topk_prob
// true when given (transformers' routers always renormalise the top-k weights).
MoeConfig parse_moe_config(const nlohmann::json& text, const std::string& where, const MoeDefaults& defaults,
                           int64_t num_hidden_layers);

// Refuses an expert-parallel degree that does not split every MoE layer's experts evenly
// (the message names --expert, the experts and the rule); sets expert_shards/expert_shard.
void set_expert_shard(MoeConfig& moe, int64_t shards, int64_t shard);

}  // namespace mmsp::model
