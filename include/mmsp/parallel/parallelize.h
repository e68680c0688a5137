// The one place that spreads a model over the mesh (torchtitan's parallelize_*): the
// model names no parallelism, and parallelize installs every one on it, once, before
// the first step:
//   - activation checkpointing (recomputed decoder layers, and vision blocks with `all`;
//     their inputs offloaded to host memory if asked) and the tiled MLP;
//   - ZeRO 1-3 over the data group (zero/sharded_model.h): the masters sharded, and from
//     stage 2 the hooks that reduce-scatter each unit's gradients as its backward ends
//     and, at stage 3, gather and free its weights around each use (zero/zero_hooks.h);
//   - sequence parallelism, whose plan changes with each step's batch: the groups, the
//     vision mode and the attention options it runs with, from which forward_step makes
//     each step's decoder attention and vision router (step_parallelism.h).
// The trainer, the benchmarks and the tests call this; nothing else installs hooks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "mmsp/attention/local_attention.h"
#include "mmsp/dist/group.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/vision/vision_mode.h"
#include "mmsp/model/vlm.h"
#include "mmsp/parallel/grad_sync.h"
#include "mmsp/parallel/step_parallelism.h"
#include "mmsp/parallel/zero/shard_level.h"
#include "mmsp/parallel/zero/sharded_model.h"

namespace mmsp::parallel {

struct ParallelizeOptions {
  // Activation checkpointing (--checkpoint-activations, --offload-activations).
  model::ActivationCheckpointing checkpoint_activations = model::ActivationCheckpointing::none;
  bool offload_activations = false;
  int64_t mlp_tile = 0;  // --tiled-mlp: 0 off, model::kAutoMlpTile, or tokens per tile
  // The ranks over which each weight's gradient sums, and ZeRO shards it: every rank whose
  // tokens reach it (dp × context: the mesh's world). The caller names the group, so that
  // an axis of its own (expert weights summed over their replicas) is a group here, not a
  // world assumed below.
  dist::GroupPtr data;
  // The ranks over which a mixture-of-experts layer's expert weights' gradients sum: those
  // holding the same experts (the mesh's expert_replica; with --expert 1 the world, as
  // `data`). Null: `data`.
  dist::GroupPtr expert_data;
  // ZeRO (--shard) over `data`: the masters in master_dtype, buckets of bucket_bytes. With
  // expert parallelism the expert weights are sharded over `expert_data` instead.
  ShardLevel shard = ShardLevel::none;
  at::ScalarType master_dtype = at::kFloat;
  int64_t bucket_bytes = kDefaultBucketBytes;
  // Sequence parallelism: the groups of the step, how the vision rows are placed, the
  // attention kernel's options.
  StepGroups groups;
  model::VisionMode vision = model::VisionMode::routed;
  attention::AttentionOptions attention;
  // Communication issued ahead of the compute that hides it (--overlap-communication): the
  // ring's next K/V and its dK/dV home, ZeRO-3's next unit's gather. Off: each waited for
  // where it is issued; the results are bitwise the same.
  bool overlap_communication = true;
};

// What parallelize installed on a model: what its steps and its weight update need.
struct ModelParallelism {
  StepGroups groups;
  model::VisionMode vision = model::VisionMode::routed;
  attention::AttentionOptions attention;
  dist::GroupPtr data;  // the group each weight's gradient sums over (ParallelizeOptions::data)
  // The model's parameters sharded over `data`; null for --shard none (every rank holds
  // them whole and a replicated update sums their gradients over `data`).
  std::shared_ptr<ShardedModel> zero;
  // Expert parallelism under --shard: the expert weights sharded over expert_data (their
  // gradients reduce-scattered there, their weights gathered there), beside `zero`'s
  // other weights over `data`; null otherwise.
  std::shared_ptr<ShardedModel> expert_zero;
  // Expert parallelism (the expert group has more than one rank): the expert weights'
  // gradients sum over expert_data instead, and their squares over `experts` for the norm;
  // `moe` says which experts this rank holds (for gathering the whole model). Null: none.
  dist::GroupPtr expert_data, experts;
  model::MoeConfig moe;
};

// Installs the options' parallelisms on `vlm` (its parameters on their device and in
// their dtype already). Under --shard parameters the model's weights are freed here and
// gathered around their uses from then on.
ModelParallelism parallelize(model::Vlm& vlm, const ParallelizeOptions& options);

// Takes off what parallelize installed that outlives a run (the hooks hold the sharded
// model): call before the model or the update goes.
void unparallelize(model::Vlm& vlm);

// This step of `vlm` under `parallelism`: model::rank_inputs, parallelize_step and
// Vlm::forward in one call (`aux_loss_scale`: model::StepParallelism's).
model::StepOutput forward_step(const model::Vlm& vlm, const plan::Batch& batch, const plan::StepPlan& plan,
                               const model::PixelInputs& pixels, const ModelParallelism& parallelism,
                               double aux_loss_scale = 1);

}  // namespace mmsp::parallel
