// Differentiable all-to-all that scatters one tensor dim and gathers another: the
// Ulysses exchange. With P ranks, x is cut into P equal pieces along scatter_dim;
// piece p goes to rank p; the pieces received are joined along gather_dim in rank
// order. E.g. q [T/P, H, D] with scatter_dim=1, gather_dim=0 -> [T, H/P, D].
// Backward is the same exchange with the two dims swapped.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/dist/group.h"

namespace mmsp::dist {

// Every rank passes the same shape; x.size(scatter_dim) must divide by group size.
at::Tensor all_to_all(const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim, const GroupPtr& group);

// Bytes this rank sends for one all_to_all of x: (P-1)/P of x.
int64_t all_to_all_bytes(const at::Tensor& x, int group_size);

namespace detail {
at::Tensor all_to_all_raw(const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim, Group& group, Pass pass);
}

}  // namespace mmsp::dist
