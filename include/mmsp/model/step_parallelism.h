// The model's step spread over the mesh, from outside the model: the step's process
// groups become the decoder's attention (planned once from this rank's shares) and the
// router of the vision rows, which the Vlm takes as StepParallelism (vlm.h). The trainer,
// the benchmarks and the tests make a step's parallelism here; the Vlm and the families
// never see a group.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/attention/local_attention.h"
#include "mmsp/dist/group.h"
#include "mmsp/model/vision_routing.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {

// The groups a step runs on: context (vision routing), ring and ulysses (attention).
struct StepGroups {
  dist::GroupPtr context, ring, ulysses;
};

// This rank's step parallelism for `vlm`: its decoder's attention planned from `inputs`'
// shares on `groups` (on the device of the decoder's weights), the vision rows routed in
// `mode` over the context group. Holds a reference to `plan`, which must outlive it.
StepParallelism parallelize_step(const Vlm& vlm, const RankInputs& inputs, const plan::StepPlan& plan,
                                 const StepGroups& groups, VisionMode mode,
                                 const attention::AttentionOptions& attention = {});

// rank_inputs, parallelize_step and Vlm::forward in one call.
StepOutput forward_step(const Vlm& vlm, const plan::Batch& batch, const plan::StepPlan& plan,
                        const PixelInputs& pixels, const StepGroups& groups, VisionMode mode,
                        const attention::AttentionOptions& attention = {});

}  // namespace mmsp::model
