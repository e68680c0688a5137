// Vision rows to the ranks that need them: each rank encodes the whole items the plan
// assigns it (Vision DP) and the rows travel to the ranks holding their placeholder
// slots, by one of three exact modes. Shared by every VLM family; the encoder is
// passed in, the routes come from the plan.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "mmsp/dist/group.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::model {

//  routed:    encode my items, all-to-all-v just the rows each rank needs (default)
//  gather:    encode my items, all-gather every row to every rank, keep mine (the
//             Python Vision DP patches); backward reduces and slices
//  replicate: every rank encodes every item of its row (plain Ulysses)
enum class VisionMode { routed, gather, replicate };
VisionMode parse_vision_mode(const std::string& name);
const char* to_string(VisionMode mode);

// Encodes the given items (indices into the row's items) and returns their rows in
// item order, [Σ rows, width]. Called with an empty list it must still return a
// [0, width] tensor that is part of the autograd graph (the rank then still takes
// part in the collectives' backward).
using EncodeItems = std::function<at::Tensor(const std::vector<int64_t>& items)>;

struct RoutedRows {
  at::Tensor rows;   // [V, width], the rows this rank's placeholder slots receive
  at::Tensor slots;  // int64 [V], the local slot of each row
};

RoutedRows route_vision_rows(const plan::StepPlan& plan, const EncodeItems& encode,
                             const dist::GroupPtr& context, VisionMode mode);

}  // namespace mmsp::model
