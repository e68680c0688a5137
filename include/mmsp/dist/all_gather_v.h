// Differentiable all-gather of rows with per-rank counts: rank p contributes
// counts[p] rows; every rank gets all of them, rank 0's first: [sum(counts), ...].
// Backward: each rank's rows get the sum over ranks of the gradient of their copy
// (a reduce-scatter, done as an all_to_all_v of the slices and a local sum).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/dist/group.h"

namespace mmsp::dist {

// counts comes from the plan and is the same on every rank.
at::Tensor all_gather_v(const at::Tensor& rows, const std::vector<int64_t>& counts, const GroupPtr& group);

}  // namespace mmsp::dist
