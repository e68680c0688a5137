// How a mixture-of-experts layer's tokens reach their experts and come back, as the model
// sees it: a function handed in from outside (parallel/expert_parallel.h binds it to the
// expert group: an all-to-all-v each way), so the model names no process group. One rank
// (no expert parallelism) runs its experts in place.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace mmsp::model {

// The experts this rank holds, on the rows they received: `rows` [R, hidden] from every
// source rank of the expert group (rank 0's first), each source's rows ordered by local
// expert, then token; counts[s · E_l + j] rows of source s for local expert j. Returns
// their outputs [R, hidden] in the same order.
using LocalExperts = std::function<at::Tensor(const at::Tensor& rows, const std::vector<int64_t>& counts)>;

struct ExpertExchange {
  // ranks of the expert group (each holds num_experts / ranks consecutive experts)
  int64_t ranks = 1;
  // rows [A, hidden] ordered by destination rank, then local expert, then token, with
  // counts[d · E_l + j] of them for local expert j of rank d: to their ranks, through
  // `experts` there, and the outputs back into the order sent. Every rank of the group
  // calls it once per MoE layer's forward (and again when the layer is recomputed), with
  // or without rows. Unset: run `experts` on the rows in place (one rank).
  std::function<at::Tensor(const at::Tensor& rows, const std::vector<int64_t>& counts, const LocalExperts& experts)>
      run;
};

}  // namespace mmsp::model
