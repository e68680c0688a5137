// Ring attention: every ring rank keeps its queries; K/V blocks travel round the
// ring (R − 1 transfers, each overlapped with the attention of the block in hand)
// and the partial results merge by log-sum-exp. Backward sends K/V round again and
// the dK/dV of each block travel with it until they are back home (R transfers).
// Works on any layout (zigzag balances causal work; contiguous is for comparison):
// the blocks a mask empties are skipped by the local kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/attention/local_attention.h"
#include "mmsp/attention/token_layout.h"
#include "mmsp/dist/group.h"

namespace mmsp::attention {

// q [T_r, H, D], k/v [T_r, H_kv, D]: this ring rank's share. shares[p] is ring rank
// p's token layout (from the plan: every rank knows every share); all have T_r tokens.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const dist::GroupPtr& ring, const std::vector<TokenLayout>& shares,
                          const AttentionOptions& options = {});

}  // namespace mmsp::attention
