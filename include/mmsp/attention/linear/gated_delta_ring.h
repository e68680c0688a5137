// Gated DeltaNet across ring ranks, on the zigzag layout as it is (no re-permutation
// between attention and GDN layers). Each rank splits its share into runs (pieces of
// segments). Two exchanges per layer, both all-gathers of sizes independent of the
// sequence length: the conv1d's left context (the last kernel − 1 inputs of every
// run) before the conv, and every run's (transition, final state from zero) after
// the kernel; each rank folds the runs before its own and corrects its outputs.
// Backward is the autograd of these ops (all_gather_v's backward is exact). The index
// work (halo rows, conv taps, chunk slots) is a RingRunIndex, planned once per step.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/attention/linear/gated_delta_rule.h"
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

// What one ring rank's Gated DeltaNet layers index with in a step, planned once from the
// ring runs (attention::plan_step_attention) and read by every layer, forward and
// backward: the rows of its runs' tails it sends as the conv's halo, the row each conv
// tap reads, the rule's chunk slots and where each rank's run states land when gathered.
// Its tensors are on the step's device.
struct RingRunIndex {
  RingRuns runs;
  int ring_rank = 0;
  int64_t conv_kernel = 0;  // W, of the config (linear_conv_kernel_dim)
  int64_t tokens = 0;       // T_r: this rank's share
  // int64 [my runs·(W−1)]: the row of [x | zero] each of my tail rows sends (T_r: the
  // zero row, before a run's start); undefined when nothing is exchanged (one rank, W = 1)
  at::Tensor halo_rows;
  at::Tensor conv_taps;   // int64 [T_r·W]: the row of [x | every rank's tails | zero] tap j of token t reads
  int64_t conv_rows = 0;  // rows of [x | every rank's tails | zero]
  RunChunks chunks;       // my runs' chunk slots (its chunk is the kernel's)
  std::vector<int64_t> first_state_row;  // [ring rank]: the row of its first run among the gathered states
  // shares: every ring rank's share (the plan's layouts), as for RingRuns::make.
  static RingRunIndex make(const std::vector<TokenLayout>& shares, int ring_rank, int64_t conv_kernel, int64_t chunk,
                           const at::Device& device);
};

// Causal depthwise conv over each segment then SiLU: out_t = silu(Σ_j w[:, j] x_{t−W+1+j}),
// inputs before the segment start being zero. x [T_r, Ch] (this ring rank's share),
// weight [Ch, W] (W = index.conv_kernel). ring may be null (one rank): then every run
// must start its segment.
at::Tensor gated_delta_conv(const at::Tensor& x, const at::Tensor& weight, const RingRunIndex& index,
                            const dist::GroupPtr& ring);

// The gated delta rule (see gated_delta_rule.h) of this ring rank's share, its runs'
// initial states received from the ranks that hold the earlier pieces. Inputs as in
// gated_delta_rule (chunk: index.chunks.chunk); out [T_r, H, V].
at::Tensor gated_delta_ring_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                 const at::Tensor& beta, const RingRunIndex& index, const dist::GroupPtr& ring);

// Bytes this rank sends per layer forward, as the all-gathers count them:
// conv context (R−1)·max_runs·(W−1)·Ch·b and states (R−1)·max_runs·H·K·(K+V)·b_state.
int64_t gated_delta_ring_conv_bytes(int ring, int64_t max_runs, int64_t kernel, int64_t channels, int64_t element_size);
int64_t gated_delta_ring_state_bytes(int ring, int64_t max_runs, int64_t heads, int64_t key_dim, int64_t value_dim,
                                     int64_t state_element_size);

}  // namespace mmsp::attention
