// The mixture-of-experts fields of a text config; see moe_config.h.
#include "mmsp/model/config/moe_config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "json_fields.h"
#include "mmsp/core/check.h"

namespace mmsp::model {

using json_fields::JsonFields;

bool MoeConfig::sparse(int64_t layer) const {
  if (!any()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

namespace {

// Qwen3.5-MoE's config has no decoder_sparse_step nor mlp_only_layers (transformers deletes
// them and makes every layer sparse): a file that sets them otherwise means another model.
void refuse_dense_layers(const JsonFields& f) {
  MMSP_CHECK(f.integer("decoder_sparse_step", 1) == 1, f.name("decoder_sparse_step"), " is ",
             f.integer("decoder_sparse_step", 1), ", but every layer of this model is a mixture of experts ",
             "(transformers ignores the key); remove it");
  const std::vector<int64_t> dense = f.integers("mlp_only_layers", {}, 0);
  MMSP_CHECK(dense.empty(), f.name("mlp_only_layers"), " lists ", dense.size(),
             " layer(s), but every layer of this model is a mixture of experts (transformers ignores the key); "
             "remove it");
}

}  // namespace

MoeConfig parse_moe_config(const nlohmann::json& text, const std::string& where, const MoeDefaults& d,
                           int64_t num_hidden_layers) {
  const JsonFields f(text, where);
  MoeConfig m;
  m.layout = d.layout;
  m.num_experts = f.integer("num_experts", d.num_experts);
  // transformers 5 writes Qwen3-VL-MoE's num_experts as num_local_experts (its config's
  // attribute_map), the released files (4.57) as num_experts: read either. Qwen3.5-MoE's config
  // (the one without decoder_sparse_step) has no such alias, and transformers ignores the key.
  if (d.reads_sparse_step && text.contains("num_local_experts")) {
    const int64_t alias = f.integer("num_local_experts", m.num_experts);
    MMSP_CHECK(!text.contains("num_experts") || alias == m.num_experts, f.name("num_local_experts"), " (", alias,
               ") differs from ", f.name("num_experts"), " (", m.num_experts,
               "): transformers reads one as the other; keep one of them");
    m.num_experts = alias;
  }
  m.num_experts_per_tok = f.integer("num_experts_per_tok", d.num_experts_per_tok);
  MMSP_CHECK(m.num_experts_per_tok <= m.num_experts, f.name("num_experts_per_tok"), " (", m.num_experts_per_tok,
             ") must be at most ", f.name("num_experts"), " (", m.num_experts, "): each token picks that many experts");
  m.moe_intermediate_size = f.integer("moe_intermediate_size", d.moe_intermediate_size);
  if (d.shared_expert_intermediate_size > 0)
    m.shared_expert_intermediate_size = f.integer("shared_expert_intermediate_size", d.shared_expert_intermediate_size);
  if (d.reads_sparse_step) {
    m.decoder_sparse_step = f.integer("decoder_sparse_step", 1);
    m.mlp_only_layers = f.integers("mlp_only_layers", {}, 0);
    for (int64_t layer : m.mlp_only_layers)
      MMSP_CHECK(layer < num_hidden_layers, f.name("mlp_only_layers"), " lists layer ", layer, ", but the decoder has ",
                 num_hidden_layers, " layers (0 to ", num_hidden_layers - 1, ")");
  } else {
    refuse_dense_layers(f);
  }
  m.router_aux_loss_coef = f.number("router_aux_loss_coef", m.router_aux_loss_coef, true);  // finite, >= 0
  m.output_router_logits = f.boolean("output_router_logits", false);
  // transformers 5.17's routers renormalise the top-k weights whatever the file says.
  MMSP_CHECK(f.boolean("norm_topk_prob", true), f.name("norm_topk_prob"),
             " is false, but transformers' router always renormalises the top-k weights to sum to 1; remove it");
  return m;
}

void set_expert_shard(MoeConfig& moe, int64_t shards, int64_t shard) {
  MMSP_ASSERT(shards >= 1 && shard >= 0 && shard < shards);
  if (moe.any())
    MMSP_CHECK(moe.num_experts % shards == 0, "--expert ", shards, " must divide num_experts (", moe.num_experts,
               "): each of the ", shards, " ranks of an expert group holds the same number of every MoE layer's ",
               "experts");
  moe.expert_shards = shards;
  moe.expert_shard = shard;
}

}  // namespace mmsp::model
