// Differentiable sum all-reduce. Every rank gets the sum of every rank's x; since
// each rank's loss depends on its copy, the backward is again a sum all-reduce.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/dist/group.h"

namespace mmsp::dist {

// bf16 through Gloo (which has no bf16 sum) is summed in fp32 and rounded once.
at::Tensor all_reduce(const at::Tensor& x, const GroupPtr& group);

// In place, not differentiable (gradient synchronisation, metrics).
void all_reduce_(at::Tensor& x, Group& group);

// Bytes this rank sends in a ring all-reduce of n bytes: 2 (P-1)/P n.
int64_t all_reduce_bytes(int64_t bytes, int group_size);

}  // namespace mmsp::dist
