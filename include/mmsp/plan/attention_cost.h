// Planned attention communication of one context rank, from the plan alone: the bytes its
// Ulysses all-to-alls and its ring K/V passes send per training step for a given attention
// shape. The formulas (docs/plan.md "Placement", docs/runtime.md "Communication volumes")
// are what the byte counters of dist/ count; the counters themselves stay in dist/.
#pragma once

#include <cstdint>
#include <vector>

namespace mmsp::plan {

// The decoder's attention as far as bytes go. Defaults: Qwen2-VL-7B's language model
// (hidden 3584 = 28 heads x 128), bf16.
struct AttentionShape {
  int64_t heads = 28;         // H, query heads
  int64_t kv_heads = 4;       // H_kv
  int64_t head_dim = 128;     // D
  int64_t element_bytes = 2;  // b
  int64_t layers = 28;        // softmax-attention decoder layers
};

// K/V heads as sent: repeated up to U when there are fewer than the ulysses ranks.
int64_t sent_kv_heads(const AttentionShape& shape, int ulysses);

// Ulysses, forward and backward of every layer: q, k, v and the output each go tokens ->
// heads and back; a rank keeps 1/U of what it exchanges:
//   2 x layers x (U-1)/U x tokens x (2H + 2H_kv') x D x b
// tokens: the slots it exchanges (zigzag: all local slots; adaptive: its split slots).
double ulysses_bytes(const AttentionShape& shape, int ulysses, int64_t tokens);

// The all-to-all-v of a mixed placement, where rank u of the Ulysses group exchanges
// tokens[u] slots (its split slots): it sends q, k, v (backward: dout) of its own tokens to
// the U-1 others and the output (backward: dq, dk, dv) of theirs back to them:
//   layers x (2H + 2H_kv')/U x ((U-1) x tokens[u] + sum_{p != u} tokens[p]) x D x b
// Equal counts give the formula above; the group's total is the same either way.
double ulysses_bytes(const AttentionShape& shape, const std::vector<int64_t>& tokens, int rank);

// Ring, forward and backward of every layer: K and V of the ring rank's share pass R-1 hops
// forward; backward passes them again and sends dK/dV home (R hops):
//   layers x (3R-2) x 2 x share x (H_kv'/U) x D x b
// share: the ring rank's tokens whose K/V travel (zigzag: U x local slots; adaptive: the split
// share). 0 when R = 1.
double ring_bytes(const AttentionShape& shape, int ring, int ulysses, int64_t share);

}  // namespace mmsp::plan
