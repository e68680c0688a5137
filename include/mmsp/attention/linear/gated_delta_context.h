// Gated DeltaNet under context parallelism, as ulysses_attention.h is for softmax
// attention: the layer hands over its per-token inputs of every key head and the rule of
// a range of key heads; this spreads the heads over the Ulysses group (an all-to-all of
// the inputs there, one of the outputs back), the tokens over the ring (the rule passes
// its state, gated_delta_ring.h), or both, and under a mixed placement sends only the
// split segments (the whole ones run at home with every head). The layer
// (model/layers/gated_deltanet_layer.h) never sees a group.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "mmsp/attention/context_attention.h"
#include "mmsp/attention/linear/gated_delta_ring.h"
#include "mmsp/attention/token_layout.h"

namespace mmsp::attention {

// What the layer needs of the mesh and the plan: the context groups (null or one-member
// groups for none), the layout of every ring rank's share, and their runs and index
// tensors (planned once per step, step_attention.h; null: made here). A mixed placement
// (split_slots not empty, as StepAttention): only the split slots go through Ulysses
// (all-to-all-v) and the ring, `index` then being over the split shares; the whole slots
// run the rule at home with every head, over `whole`.
struct GatedDeltaContext {
  ContextGroups groups;
  std::vector<TokenLayout> ring_shares;
  std::shared_ptr<const RingRunIndex> index;
  std::vector<int64_t> split_slots;  // [context rank]; empty: every slot is exchanged
  std::shared_ptr<const RingRunIndex> whole;
};

// Where one call of the layer's rule runs: the index over its tokens and the ring that
// passes state between them (null: none). The layer hands it on to the conv and the rule.
struct GatedDeltaRun {
  const RingRunIndex& index;
  dist::GroupPtr ring;
};
// A run on this rank alone, no ring (a sequence tile of a whole share).
inline GatedDeltaRun local_run(const RingRunIndex& index) { return {index, dist::GroupPtr()}; }
inline at::Tensor gated_delta_conv(const at::Tensor& x, const at::Tensor& weight, const GatedDeltaRun& run) {
  return gated_delta_conv(x, weight, run.index, run.ring);
}
inline at::Tensor gated_delta_ring_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& g, const at::Tensor& beta, const GatedDeltaRun& run) {
  return gated_delta_ring_rule(q, k, v, g, beta, run.index, run.ring);
}

// The layer's sizes that the placement reads.
struct GatedDeltaHeads {
  int64_t key_heads = 0;    // H_k, the unit Ulysses spreads
  int64_t value_heads = 0;  // H_v, a multiple of H_k
  int64_t value_dim = 0;    // V
  int64_t conv_kernel = 0;  // W, for the index's conv context
  int64_t chunk = 0;        // the rule's chunk, for the index
};

// The rule of key heads [first, first + heads) on tokens in run.index's layout:
// inputs [T, heads, F] -> o [T, heads·H_v/H_k, V].
using GatedDeltaHeadsRule =
    std::function<at::Tensor(const at::Tensor& inputs, int64_t first, int64_t heads, const GatedDeltaRun& run)>;

// Throws unless the ulysses degree divides both head counts (names the values).
void check_gated_delta_heads(int64_t key_heads, int64_t value_heads, int ulysses);

// inputs [T_l, H_k, F]: this rank's slots (its Ulysses slice of its ring share) ->
// o [T_l, H_v, V]. Padding slots give zero. Every check (the context against the heads
// and the tokens) runs before the first collective.
at::Tensor gated_delta_context_rule(const at::Tensor& inputs, const GatedDeltaHeads& heads,
                                    const GatedDeltaContext& context, const GatedDeltaHeadsRule& rule);

}  // namespace mmsp::attention
