// Vision rows to the ranks that need them: each rank encodes the whole items the plan
// assigns it (Vision DP) and the rows travel over the context group to the ranks holding
// their placeholder slots, by one of three exact modes (model/vision/vision_mode.h). Shared by
// every VLM family; the encoder is passed in (the Vlm's), the routes come from the plan.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/dist/group.h"
#include "mmsp/model/vision/routed_rows.h"
#include "mmsp/model/vision/vision_mode.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::parallel {

model::RoutedRows route_vision_rows(const plan::StepPlan& plan, const model::EncodeItems& encode,
                                    const dist::GroupPtr& context, model::VisionMode mode);

// route_vision_rows bound to this step's plan, group and mode: what the VLM step takes
// (model/vlm.h). Holds a reference to `plan`, which must outlive it.
model::VisionRouter vision_router(const plan::StepPlan& plan, dist::GroupPtr context, model::VisionMode mode);

}  // namespace mmsp::parallel
