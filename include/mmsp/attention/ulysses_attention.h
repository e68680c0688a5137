// Ulysses attention: an all-to-all turns "my tokens, all heads" into "all tokens of
// the group, my heads", an inner attention runs on that, and the reverse all-to-all
// brings the output back. Four all-to-alls (q, k, v, out); backward is the same
// exchanges mirrored (the collectives' own backward). K/V heads fewer than the
// group are repeated first so that each rank gets the K/V its query heads use.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "mmsp/dist/group.h"

namespace mmsp::attention {

// The attention run on the gathered tokens: q [T_g, H/U, D], k/v [T_g, H_kv', D].
using InnerAttention = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

// q [T_u, H, D], k/v [T_u, H_kv, D] -> [T_u, H, D]. The group's tokens are the
// ranks' tokens joined in group-rank order.
at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const dist::GroupPtr& ulysses, const InnerAttention& inner);

// The same over unequal token counts (a mixed placement: only the split segments' slots take
// part): tokens[p] is what group rank p exchanges, known to every rank from the plan. One
// all-to-all-v per tensor: q [tokens[u], H, D] -> [Σ tokens, H/U, D] and the output back.
at::Tensor ulysses_attention_v(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const dist::GroupPtr& ulysses, const std::vector<int64_t>& tokens,
                               const InnerAttention& inner);

// The all-to-all-v of ulysses_attention_v alone: [tokens[u], H, F] -> [Σ tokens, H/U, F]
// (head group p of my tokens to rank p), and back. Differentiable.
at::Tensor ulysses_scatter_heads(const at::Tensor& x, const std::vector<int64_t>& tokens,
                                 const dist::GroupPtr& ulysses);
at::Tensor ulysses_gather_heads(const at::Tensor& y, const std::vector<int64_t>& tokens, const dist::GroupPtr& ulysses);

// Throws unless H divides by U and H_kv divides by U or U by H_kv (names the values).
void check_ulysses_heads(int64_t heads, int64_t kv_heads, int ulysses);

}  // namespace mmsp::attention
