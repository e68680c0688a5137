// Every parallelism installed on a model in one place; see parallelize.h.
#include "mmsp/parallel/parallelize.h"

#include "mmsp/core/check.h"
#include "mmsp/model/layers/expert_names.h"
#include "mmsp/model/named_params.h"
#include "mmsp/parallel/zero/zero_hooks.h"

namespace mmsp::parallel {
namespace {

// What ZeRO shards with masters and optimizer state: the parameters that train. A frozen
// one (requires_grad false: --freeze, LoRA's base) has no gradient to reduce and no master
// or optimizer state.
model::NamedParams trainable_parameters(const model::Vlm& vlm) {
  model::NamedParams out;
  for (auto& [name, p] : model::named_parameters(vlm))
    if (p.requires_grad()) out.emplace_back(name, p);
  return out;
}

// Under --shard parameters the frozen parameters of the layers and vision blocks are
// sharded too (in the model's dtype, gathered with their unit); those outside the units and
// a frozen head or embedding (units read by rows) stay whole. Their units in `unit_of`.
model::NamedParams sharded_frozen_parameters(const model::Vlm& vlm, const std::vector<model::HookUnit>& units,
                                             std::vector<int>& unit_of) {
  model::NamedParams frozen, out;
  for (auto& [name, p] : model::named_parameters(vlm))
    if (!p.requires_grad()) frozen.emplace_back(name, p);
  const std::vector<int> all = unit_index_of(frozen, units);
  const std::vector<ShardUnitUse> uses = shard_unit_uses(units);
  unit_of.clear();
  for (size_t i = 0; i < frozen.size(); ++i) {
    if (all[i] < 0 || uses.at(all[i]).by_rows) continue;
    out.push_back(frozen[i]);
    unit_of.push_back(all[i]);
  }
  return out;
}

// The expert weights of `params`, or (experts false) the others.
model::NamedParams only_experts(const model::NamedParams& params, bool experts) {
  model::NamedParams out;
  for (const auto& named : params)
    if (model::is_expert_parameter(named.first) == experts) out.push_back(named);
  return out;
}

}  // namespace

ModelParallelism parallelize(model::Vlm& vlm, const ParallelizeOptions& options) {
  vlm.set_activation_checkpointing(options.checkpoint_activations, options.offload_activations);
  vlm.set_mlp_tile(options.mlp_tile);
  ModelParallelism out{options.groups, options.vision, options.attention, options.data, nullptr};
  out.attention.overlap = options.overlap_communication;
  if (options.groups.expert && options.groups.expert->size() > 1) {
    MMSP_CHECK(options.expert_data, "parallelize: expert parallelism over ", options.groups.expert->size(),
               " ranks needs the group the expert weights' gradients sum over (ParallelizeOptions::expert_data)");
    out.expert_data = options.expert_data;
    out.experts = options.groups.expert;
    out.moe = vlm.config().text.moe;
  }
  if (options.shard != ShardLevel::none) {
    MMSP_CHECK(options.data, "parallelize: --shard ", to_string(options.shard),
               " needs the group the gradients sum over (ParallelizeOptions::data)");
    const model::NamedParams params = trainable_parameters(vlm);
    MMSP_CHECK(!params.empty(), "parallelize: --shard ", to_string(options.shard),
               " over a model with nothing to train");
    const std::vector<model::HookUnit> units = vlm.hook_units();
    std::vector<int> frozen_unit_of;
    model::NamedParams frozen;
    if (options.shard == ShardLevel::parameters) frozen = sharded_frozen_parameters(vlm, units, frozen_unit_of);
    // Expert parallelism: the experts' shards are cut over the ranks holding the same
    // experts (each of them computes those experts' whole gradient share), the rest over
    // every rank; each element still lives in one rank's shard.
    const bool split = out.experts != nullptr;
    for (const auto& named : frozen)
      MMSP_CHECK(!split || !model::is_expert_parameter(named.first), "parallelize: the frozen expert weight \"",
                 named.first, "\" cannot be sharded under expert parallelism");
    const model::NamedParams dense = split ? only_experts(params, false) : params;
    out.zero = std::make_shared<ShardedModel>(dense, options.master_dtype, options.data, options.bucket_bytes,
                                              options.shard, unit_index_of(dense, units), shard_unit_uses(units),
                                              std::move(frozen), frozen_unit_of);
    if (split) {
      const model::NamedParams experts = only_experts(params, true);
      out.expert_zero =
          std::make_shared<ShardedModel>(experts, options.master_dtype, options.expert_data, options.bucket_bytes,
                                         options.shard, unit_index_of(experts, units), shard_unit_uses(units));
    }
  }
  vlm.set_layer_hooks(make_zero_hooks({out.zero, out.expert_zero}, options.overlap_communication));
  return out;
}

void unparallelize(model::Vlm& vlm) { vlm.set_layer_hooks(nullptr); }

model::StepOutput forward_step(const model::Vlm& vlm, const plan::Batch& batch, const plan::StepPlan& plan,
                               const model::PixelInputs& pixels, const ModelParallelism& parallelism,
                               double aux_loss_scale) {
  return forward_step(vlm, batch, plan, pixels, parallelism.groups, parallelism.vision, parallelism.attention,
                      aux_loss_scale);
}

}  // namespace mmsp::parallel
