// Expert parallelism from outside the model: a mixture-of-experts layer's tokens sent to
// the ranks holding their experts and back, over the expert group (plan/mesh.h's folded
// `expert` axis: blocks of --expert consecutive ranks, each holding num_experts / expert
// consecutive experts of every sparse layer). Dropless: every (token, pick) row goes, in
// one all-to-all-v each way, after an all-to-all of the counts per (rank, expert) (the
// routing is the data's, so the receivers learn their counts from the senders). Both
// all-to-all-v are differentiable (their backward the reverse exchange).
#pragma once

#include "mmsp/dist/group.h"
#include "mmsp/model/layers/expert_exchange.h"

namespace mmsp::parallel {

// The exchange over `expert_group` (null or one rank: the experts run in place).
model::ExpertExchange expert_exchange(const dist::GroupPtr& expert_group);

// Bytes one rank sends for a sparse layer's tokens, forward (the backward sends the same
// again): rows of `hidden` elements of `element_bytes`, T tokens on this rank each picking
// k experts of which a share (P−1)/P lives elsewhere when the picks are uniform:
// 2 · T · k · (P−1)/P · hidden · element_bytes (to the experts and back), plus the counts'
// all-to-all, 8 · (P−1) · E/P.
int64_t expert_exchange_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t element_bytes, int64_t experts,
                              int ranks);

}  // namespace mmsp::parallel
