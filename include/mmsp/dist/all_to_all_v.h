// Differentiable all-to-all of rows with per-destination counts: vision routing.
// rows [N, ...] holds send_counts[0] rows for group rank 0, then send_counts[1]
// rows for rank 1, ...; the result [sum(recv_counts), ...] holds the rows from rank
// 0 first, then rank 1, ... Backward sends the row gradients back the same way
// (the counts swapped). Zero counts are fine: the rank still takes part.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/dist/group.h"

namespace mmsp::dist {

// send_counts[p]: rows this rank sends to p; recv_counts[p]: rows it gets from p.
// Both come from the plan, known on every rank: nothing is exchanged to learn them.
at::Tensor all_to_all_v(const at::Tensor& rows, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts, const GroupPtr& group);

namespace detail {
at::Tensor all_to_all_v_raw(const at::Tensor& rows, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& recv_counts, Group& group, Pass pass,
                            CommKind kind = CommKind::all_to_all_v);
}

}  // namespace mmsp::dist
