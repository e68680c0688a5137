// Ring attention: every ring rank keeps its queries; K/V blocks travel round the
// ring (R − 1 transfers, each overlapped with the attention of the block in hand)
// and the partial results merge by log-sum-exp. Backward sends K/V round again and
// the dK/dV of each block travel with it until they are back home (R transfers), each
// hop overlapped with the next block's backward (double-buffered: one dK/dV in flight
// while the next is computed).
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
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const dist::GroupPtr& ring,
                          const std::vector<TokenLayout>& shares, const AttentionOptions& options = {});

// The kernel plans of one ring rank, planned once per step: its share's queries
// against every ring rank's keys (from[p]: keys of ring rank p's share).
struct RingKernels : torch::CustomClassHolder {
  std::vector<KernelPlanPtr> from;
  bool overlap = true;  // AttentionOptions::overlap
};
// Checks the shares (equal lengths, valid layouts; names the bad value) and plans.
c10::intrusive_ptr<RingKernels> plan_ring_kernels(const std::vector<TokenLayout>& shares, int ring_rank,
                                                  const AttentionOptions& options, const at::Device& device);

// The ring's forward and its backward apart, without autograd: the forward's out (q's
// dtype) and lse, and the backward's dq, dk, dv (the accumulation dtype) from the final
// out and lse. The autograd form below and the step's attention (step_attention.h) use them.
PartialAttention ring_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const dist::GroupPtr& ring, const RingKernels& kernels);
AttentionGrads ring_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                       const dist::GroupPtr& ring, const RingKernels& kernels);

// The same with the plans made beforehand; forward and backward reuse them.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const dist::GroupPtr& ring,
                          const c10::intrusive_ptr<RingKernels>& kernels);

}  // namespace mmsp::attention
