// Vision rows to the ranks that need them: each rank encodes the whole items the plan
// assigns it (Vision DP) and the rows travel to the ranks holding their placeholder
// slots, by one of three exact modes. Shared by every VLM family; the encoder is
// passed in, the routes come from the plan.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "mmsp/dist/group.h"
#include "mmsp/model/routed_rows.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::model {

//  routed:    encode my items, all-to-all-v just the rows each rank needs (default)
//  gather:    encode my items, all-gather every row to every rank, keep mine (the
//             Python Vision DP patches); backward reduces and slices
//  replicate: every rank encodes every item of its row (plain Ulysses)
enum class VisionMode { routed, gather, replicate };
VisionMode parse_vision_mode(const std::string& name);
const char* to_string(VisionMode mode);

RoutedRows route_vision_rows(const plan::StepPlan& plan, const EncodeItems& encode,
                             const dist::GroupPtr& context, VisionMode mode);

// route_vision_rows bound to this step's plan, group and mode: what the VLM step takes
// (vlm.h). Holds a reference to `plan`, which must outlive it.
VisionRouter vision_router(const plan::StepPlan& plan, dist::GroupPtr context, VisionMode mode);

}  // namespace mmsp::model
