// Attention over the context group in one call: q, k, v of this rank's tokens and the
// plan's layout of the group; the scheme follows the mesh — local (1 rank), Ulysses
// (ulysses > 1), ring (ring > 1) or hybrid (both: Ulysses inside each ring rank, ring
// across). Every check runs before the first collective. It plans the kernel's blocks
// on every call; model code plans a step once instead (step_attention.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/attention/local_attention.h"
#include "mmsp/attention/token_layout.h"
#include "mmsp/dist/group.h"

namespace mmsp::attention {

struct ContextGroups {
  dist::GroupPtr ring;     // ranks that exchange K/V
  dist::GroupPtr ulysses;  // ranks that exchange heads
};

// ring_shares[p]: the layout of ring rank p's share (T/R tokens), which its ulysses
// ranks split contiguously: this rank holds slice `ulysses rank` of its share.
// q [T/S, H, D], k/v [T/S, H_kv, D] -> [T/S, H, D]. split_slots: a mixed placement's
// split slots per context rank (step_attention.h); empty: every slot is exchanged.
at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextGroups& groups,
                             const std::vector<TokenLayout>& ring_shares, const AttentionOptions& options = {},
                             const std::vector<int64_t>& split_slots = {});

// The scheme the mesh selects, for logs and benchmarks: "local", "ulysses", "ring", "hybrid".
const char* scheme_name(const ContextGroups& groups);

}  // namespace mmsp::attention
