// Every parallelism installed on a model in one place; see parallelize.h.
#include "mmsp/parallel/parallelize.h"

#include "mmsp/core/check.h"
#include "mmsp/model/named_params.h"
#include "mmsp/parallel/zero/zero_hooks.h"

namespace mmsp::parallel {
namespace {

// What ZeRO shards: the parameters that train. A frozen one (requires_grad false:
// --freeze) has no gradient to reduce and no master or optimizer state; it stays whole
// on every rank and its unit's hooks find no bucket of it.
model::NamedParams trainable_parameters(const model::Vlm& vlm) {
  model::NamedParams out;
  for (auto& [name, p] : model::named_parameters(vlm))
    if (p.requires_grad()) out.emplace_back(name, p);
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
    MMSP_CHECK(options.shard == ShardLevel::none, "--expert ", options.groups.expert->size(), " with --shard ",
               to_string(options.shard), " is not supported yet: the expert weights would need their own shards ",
               "over the ranks holding the same experts; use --shard none");
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
    out.zero = std::make_shared<ShardedModel>(params, options.master_dtype, options.data, options.bucket_bytes,
                                              options.shard, unit_index_of(params, units), shard_unit_uses(units));
  }
  vlm.set_layer_hooks(make_zero_hooks(out.zero, options.overlap_communication));
  return out;
}

void unparallelize(model::Vlm& vlm) { vlm.set_layer_hooks(nullptr); }

model::StepOutput forward_step(const model::Vlm& vlm, const plan::Batch& batch, const plan::StepPlan& plan,
                               const model::PixelInputs& pixels, const ModelParallelism& parallelism) {
  return forward_step(vlm, batch, plan, pixels, parallelism.groups, parallelism.vision, parallelism.attention);
}

}  // namespace mmsp::parallel
