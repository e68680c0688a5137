// How ZeRO treats each of a model's hooked units (model/hooks/layer_hooks.h): how often a
// step gathers its weights, whether its gradient is dense or comes as lookup rows,
// whether a neighbour prefetches it. The sharded model acts on it; the memory
// preflight (train/memory/memory_estimate.h) prices it, from the same units.
#pragma once

#include <vector>

#include "mmsp/model/hooks/layer_hooks.h"
#include "mmsp/model/named_params.h"

namespace mmsp::parallel {

// How a step uses one unit of `unit_of` (model::HookUnit without its tensors).
struct ShardUnitUse {
  int gathers = 2;             // stage 3: all-gathers per step (each forward use, and the backward)
  bool dense_gradient = true;  // stages 2, 3: has one, reduced at its after_backward hook
  bool prefetched = true;      // stage 3: unit − 1's forward hook issues its gather early, and its
                               // backward hook unit − 1's (false: the first unit of a chain)
  bool lookup_rows = false;    // stages 2, 3: the token lookup's gradient comes as rows
  bool by_rows = false;        // stage 3: a [V, h] table read by rows (row_sharded_table.h):
                               // never gathered whole for a use, its gradient reduced by rounds
};
std::vector<ShardUnitUse> shard_unit_uses(const std::vector<model::HookUnit>& units);

// For each of `params`, the index of the entry of `units` that holds it, or −1.
std::vector<int> unit_index_of(const model::NamedParams& params, const std::vector<model::HookUnit>& units);

}  // namespace mmsp::parallel
