// Which file names feed which of mmsp's parameters: each family says (its registry
// entry, model/families/<name>/), and expert parallelism says which experts this rank
// reads; see checkpoint_naming.h.
#include "mmsp/model/checkpoint_naming.h"

#include "mmsp/core/check.h"
#include "mmsp/model/family.h"
#include "mmsp/model/layers/expert_names.h"

namespace mmsp::model {
hf::CheckpointNaming checkpoint_naming(const ModelConfig& config) {
  hf::CheckpointNaming naming = family_for(config.model_type).checkpoint_naming(config);
  add_expert_shard(naming, config.text.moe);
  return naming;
}

void add_expert_shard(hf::CheckpointNaming& naming, const MoeConfig& moe) {
  if (!moe.any() || moe.expert_shards == 1) return;
  const int64_t first = moe.first_local_expert(), rows = moe.local_experts(), total = moe.num_experts;
  if (moe.layout == ExpertLayout::fused) {
    for (const char* suffix : {".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"})
      naming.row_slices.push_back({suffix, {first, rows, total}});
    return;
  }
  // The other ranks' experts; an index beyond the config's stays unexpected.
  naming.held_elsewhere = [first, rows, total](const std::string& name) {
    const int64_t e = expert_index(name);
    return e >= 0 && e < total && (e < first || e >= first + rows);
  };
}

void check_expert_count(const hf::HfDirectory& dir, const ModelConfig& config) {
  const MoeConfig& moe = config.text.moe;
  if (!moe.any()) return;
  const bool fused = moe.layout == ExpertLayout::fused;
  const std::string rule = ", but config.json's num_experts is " + std::to_string(moe.num_experts) +
                           ": the checkpoint and the config must describe the same experts";
  std::string highest;  // per-expert files: the tensor of the highest expert index
  for (const auto& [name, tensor] : dir.tensors) {
    if (!is_expert_parameter(name)) continue;
    if (fused) {
      const int64_t experts = tensor.entry.shape.empty() ? 0 : tensor.entry.shape[0];
      MMSP_CHECK(experts == moe.num_experts, dir.path, ": \"", name, "\" holds ", experts, " experts", rule);
      continue;
    }
    const int64_t e = expert_index(name);
    MMSP_CHECK(e < moe.num_experts, dir.path, ": \"", name, "\" is expert ", e, rule);
    if (e >= 0 && (highest.empty() || e > expert_index(highest))) highest = name;
  }
  // Fewer experts than the config's: the highest index falls short (a layer's missing
  // experts are also named, one by one, when the tensors are matched).
  MMSP_CHECK(fused || highest.empty() || expert_index(highest) == moe.num_experts - 1, dir.path, ": \"", highest,
             "\" is expert ", expert_index(highest), " (the checkpoint's highest)", rule);
}

hf::CheckpointNaming llava_layout_naming(bool tie_word_embeddings) {
  hf::CheckpointNaming naming;
  naming.prefix_aliases = {{"model.language_model.", "language_model.model."},
                           {"model.vision_tower.", "vision_tower."},
                           {"model.multi_modal_projector.", "multi_modal_projector."},
                           {"lm_head.", "language_model.lm_head."}};
  if (tie_word_embeddings) {
    naming.tied_input = "language_model.model.embed_tokens.weight";
    naming.tied_output = "language_model.lm_head.weight";
  }
  return naming;
}

}  // namespace mmsp::model
