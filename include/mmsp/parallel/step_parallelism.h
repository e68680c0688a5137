// The model's step spread over the mesh, from outside the model: the step's process
// groups become the decoder's attention (planned once from this rank's shares) and the
// router of the vision rows, which the Vlm takes as model::StepParallelism (model/vlm.h).
// The trainer, the benchmarks and the tests make a step's parallelism here; the Vlm and
// the families never see a group.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/attention/local_attention.h"
#include "mmsp/dist/group.h"
#include "mmsp/model/vision/vision_mode.h"
#include "mmsp/model/vlm.h"
#include "mmsp/parallel/vision_routing.h"

namespace mmsp::parallel {

// The groups a step runs on: context (vision routing), ring and ulysses (attention); for
// mixture-of-experts decoders, every rank of the step's batch (the world: the routing
// counts are summed over it) and the expert group (expert parallelism; null: none).
struct StepGroups {
  dist::GroupPtr context, ring, ulysses;
  dist::GroupPtr batch, expert;
};

// This rank's step parallelism for `vlm`: its decoder's attention planned from `inputs`'
// shares on `groups` (on the device of the decoder's weights), the vision rows routed in
// `mode` over the context group. Holds a reference to `plan`, which must outlive it.
model::StepParallelism parallelize_step(const model::Vlm& vlm, const model::RankInputs& inputs,
                                        const plan::StepPlan& plan, const StepGroups& groups, model::VisionMode mode,
                                        const attention::AttentionOptions& attention = {});

// model::rank_inputs, parallelize_step and Vlm::forward in one call; `aux_loss_scale`:
// model::StepParallelism's.
model::StepOutput forward_step(const model::Vlm& vlm, const plan::Batch& batch, const plan::StepPlan& plan,
                               const model::PixelInputs& pixels, const StepGroups& groups, model::VisionMode mode,
                               const attention::AttentionOptions& attention = {}, double aux_loss_scale = 1);

}  // namespace mmsp::parallel
