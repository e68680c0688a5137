// Gated DeltaNet across ring ranks, on the zigzag layout as it is (no re-permutation
// between attention and GDN layers). Each rank splits its share into runs (pieces of
// segments). Two exchanges per layer, both all-gathers of sizes independent of the
// sequence length: the conv1d's left context (the last kernel − 1 inputs of every
// run) before the conv, and every run's (transition, final state from zero) after
// the kernel; each rank folds the runs before its own and corrects its outputs.
// Backward is the autograd of these ops (all_gather_v's backward is exact).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/attention/gated_delta_rule.h"
#include "mmsp/attention/token_layout.h"
#include "mmsp/dist/group.h"

namespace mmsp::attention {

// Every ring rank's runs (shares[p] from the plan), and where each run's
// predecessor in its segment lives. Pure index arithmetic, the same on every rank.
struct RingRuns {
  std::vector<std::vector<TokenRun>> runs;             // [ring rank][run]
  std::vector<std::vector<std::pair<int, int>>> pred;  // (rank, run) before it; (-1, -1) at order 0
  static RingRuns make(const std::vector<TokenLayout>& shares);
  int64_t max_runs() const;
};

// Causal depthwise conv over each segment then SiLU: out_t = silu(Σ_j w[:, j] x_{t−W+1+j}),
// inputs before the segment start being zero. x [T_r, Ch] (this ring rank's share),
// weight [Ch, W]. ring may be null (one rank): then every run must start its segment.
at::Tensor gated_delta_conv(const at::Tensor& x, const at::Tensor& weight, const RingRuns& runs,
                            const dist::GroupPtr& ring);

// The gated delta rule (see gated_delta_rule.h) of this ring rank's share, its runs'
// initial states received from the ranks that hold the earlier pieces. Inputs as in
// gated_delta_rule; out [T_r, H, V].
at::Tensor gated_delta_ring_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& g, const at::Tensor& beta, const RingRuns& runs,
                                 const dist::GroupPtr& ring, int64_t chunk = kGatedDeltaChunk);

// Bytes this rank sends per layer forward, as the all-gathers count them:
// conv context (R−1)·max_runs·(W−1)·Ch·b and states (R−1)·max_runs·H·K·(K+V)·b_state.
int64_t gated_delta_ring_conv_bytes(int ring, int64_t max_runs, int64_t kernel, int64_t channels,
                                    int64_t element_size);
int64_t gated_delta_ring_state_bytes(int ring, int64_t max_runs, int64_t heads, int64_t key_dim,
                                     int64_t value_dim, int64_t state_element_size);

}  // namespace mmsp::attention
