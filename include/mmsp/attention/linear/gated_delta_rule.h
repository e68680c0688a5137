// The gated delta rule, computed chunk-wise (chunks of 64, WY form) in plain ATen
// ops, so it runs on any device, a group of chunks at a time, read from and written to
// token order. Its backward recomputes each group from the state saved at its start and
// backpropagates through it with autograd: the graph between forward and backward holds
// the inputs as given, not every chunk's intermediates nor copies in chunk slots. It works on runs:
// contiguous token ranges that each start from their own state (a packed segment,
// or the piece of one that a ring rank holds). Communication is left to
// gated_delta_ring (state passing) and gated_delta_context (Ulysses).
//
//   S_t = exp(g_t) (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (q_t / √K)
//
// with the state S [K, V] per head. Inputs in bf16/fp16 are computed in fp32.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "mmsp/attention/token_layout.h"

namespace mmsp::attention {

constexpr int64_t kGatedDeltaChunk = 64;

// A contiguous range of local tokens [begin, begin + length) of one segment whose
// orders run first_order, first_order + 1, ...; its state starts at first_order.
struct TokenRun {
  int64_t begin = 0, length = 0;
  int64_t segment = 0, first_order = 0;
  int64_t last_order() const { return first_order + length - 1; }
};

// The maximal runs of a layout: consecutive tokens of one segment (>= 0) with
// consecutive orders. Padding (segment < 0) belongs to no run.
std::vector<TokenRun> token_runs(const TokenLayout& layout);

// Where each chunk slot of a set of runs reads its token: index work that depends only on
// the runs, the token count and the chunk, so a step plans it once for all its layers
// (gated_delta_ring.h's RingRunIndex) instead of every layer making it again.
struct RunChunks {
  int64_t tokens = 0, chunk = 0, chunks = 0, runs = 0;
  at::Tensor slot_token;           // int64 [chunks·chunk]: token of each slot; `tokens` for a padding slot
  at::Tensor slot_row;             // int64 [chunks·chunk]: the row a slot reads (a padding slot: row 0, masked)
  at::Tensor slot_padding;         // bool [chunks·chunk]: the slot pads a run
  std::vector<int64_t> chunk_run;  // [chunks]: the run of each chunk
  std::vector<bool> run_start;     // [chunks]: first chunk of its run
  static RunChunks make(const std::vector<TokenRun>& runs, int64_t tokens, int64_t chunk, const at::Device& device);
};

struct GatedDeltaOptions {
  int64_t chunk = kGatedDeltaChunk;
  // Also return each run's transition and each token's map from the run's initial
  // state to its output (what ring state passing needs).
  bool transitions = false;
  // Chunks the backward recomputes at a time (0: chosen so a group's [·, H, C, C]
  // intermediates stay cache-sized). Tests set it to cross many group borders.
  int64_t group_chunks = 0;
};

struct GatedDeltaResult {
  at::Tensor out;         // [T, H, V], zero for tokens in no run; input dtype
  at::Tensor final;       // [n_runs, H, K, V]: state after each run, from `initial`
  at::Tensor transition;  // [n_runs, H, K, K]: M with final(S0) = M S0 + final(0)
  at::Tensor q_eff;       // [T, H, K]: out_t(S0) = out_t(0) + S0ᵀ q_eff_t
};

// q, k: [T, H, K] (already L2-normalised and repeated to the value heads);
// v: [T, H, V]; g (log decay, <= 0), beta: [T, H]. initial: [n_runs, H, K, V] or
// undefined (zero). Computation dtype: fp32 for 16-bit inputs, else the input's.
GatedDeltaResult gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const at::Tensor& beta, const std::vector<TokenRun>& runs,
                                  const at::Tensor& initial = {}, const GatedDeltaOptions& options = {});

// The same over runs whose chunk slots are planned already (chunk = chunks.chunk).
GatedDeltaResult gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const at::Tensor& beta, const RunChunks& chunks, const at::Tensor& initial,
                                  bool transitions, int64_t group_chunks = 0);

}  // namespace mmsp::attention
