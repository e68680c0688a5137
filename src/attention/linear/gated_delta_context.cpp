// Gated DeltaNet's placement on the context mesh; see gated_delta_context.h.
#include "mmsp/attention/linear/gated_delta_context.h"

#include <ATen/ATen.h>

#include <optional>

#include "mmsp/attention/step_attention.h"
#include "mmsp/attention/ulysses_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_to_all.h"

namespace mmsp::attention {

namespace {

int size_of(const dist::GroupPtr& g) { return g ? g->size() : 1; }
int rank_in(const dist::GroupPtr& g) { return g ? g->rank() : 0; }

}  // namespace

void check_gated_delta_heads(int64_t key_heads, int64_t value_heads, int ulysses) {
  MMSP_CHECK(key_heads % ulysses == 0 && value_heads % ulysses == 0, "ulysses degree ", ulysses,
             " must divide the linear-attention key heads (", key_heads, ") and value heads (", value_heads,
             "); use a degree that divides ", key_heads, " and put the rest in --ring (state passing)");
}

at::Tensor gated_delta_context_rule(const at::Tensor& inputs, const GatedDeltaHeads& h,
                                    const GatedDeltaContext& context, const GatedDeltaHeadsRule& rule) {
  // Every check before the first collective.
  const int U = size_of(context.groups.ulysses), R = size_of(context.groups.ring);
  const int u = rank_in(context.groups.ulysses), r = rank_in(context.groups.ring);
  check_gated_delta_heads(h.key_heads, h.value_heads, U);
  MMSP_CHECK(static_cast<int>(context.ring_shares.size()) == R, "gated DeltaNet: ", context.ring_shares.size(),
             " ring share layouts for a ring of ", R);
  MMSP_CHECK(inputs.dim() == 3 && inputs.size(1) == h.key_heads, "gated DeltaNet: inputs must be [T, ", h.key_heads,
             ", F], got ", inputs.sizes());
  const int64_t T_l = inputs.size(0), T_r = context.ring_shares[r].size();
  MMSP_CHECK(T_l * U == T_r, "gated DeltaNet: ", T_l, " local tokens × ulysses ", U, " != ", T_r,
             " tokens in ring rank ", r, "'s share");
  const bool mixed_placement = !context.split_slots.empty();
  MMSP_CHECK(!mixed_placement || static_cast<int>(context.split_slots.size()) == R * U,
             "gated DeltaNet: ", context.split_slots.size(), " split-slot counts for a context group of ", R, " x ", U,
             " ranks");
  // The index over what this rank's rule sees (the shares, or the split shares), and, mixed,
  // over its whole slots; made here only when the step did not plan them.
  std::optional<RingRunIndex> made, made_whole;
  const int64_t a = mixed_placement ? context.split_slots[r * U + u] : T_l;
  const std::vector<TokenLayout> shares =
      mixed_placement ? split_shares(context.ring_shares, context.split_slots, U) : context.ring_shares;
  const bool exchanged = shares[r].size() > 0;  // mixed: any split segment in the row
  if (!context.index && (exchanged || !mixed_placement))
    made = RingRunIndex::make(shares, r, h.conv_kernel, h.chunk, inputs.device());
  if (!context.whole && a < T_l)
    made_whole = RingRunIndex::make({whole_slots(context.ring_shares, context.split_slots, U, r, u)}, 0, h.conv_kernel,
                                    h.chunk, inputs.device());
  const RingRunIndex* index = context.index ? context.index.get() : made ? &*made : nullptr;
  const RingRunIndex* whole = context.whole ? context.whole.get() : made_whole ? &*made_whole : nullptr;
  for (const RingRunIndex* i : {index, whole})
    MMSP_CHECK(!i || (i->conv_kernel == h.conv_kernel && i->chunks.chunk == h.chunk),
               "gated DeltaNet: the step planned its index for conv kernel ", i->conv_kernel, " and chunk ",
               i->chunks.chunk, ", but the layer has conv kernel ", h.conv_kernel, " and chunk ", h.chunk);
  MMSP_CHECK(!exchanged || (index && index->tokens == shares[r].size()), "gated DeltaNet: the step's index is for ",
             index ? index->tokens : 0, " tokens of ring rank ", r, "'s share, which holds ", shares[r].size());

  const int64_t Hk_l = h.key_heads / U;
  std::vector<at::Tensor> parts;  // o of the exchanged slots [0, a), then of the whole ones
  if (!mixed_placement) {
    at::Tensor m = inputs;
    // [T_l, U, Hk/U·F] -> [T_r, 1, Hk/U·F]: scatter key-head groups, gather tokens
    if (U > 1) m = dist::all_to_all(m.reshape({T_l, U, Hk_l * m.size(-1)}), 1, 0, context.groups.ulysses);
    at::Tensor o = rule(m.reshape({T_r, Hk_l, -1}), u * Hk_l, Hk_l, GatedDeltaRun{*index, context.groups.ring});
    if (U > 1) o = dist::all_to_all(o, 0, 1, context.groups.ulysses);  // [T_l, Hv, V]
    parts.push_back(o);
  } else {
    if (exchanged) {  // every ulysses rank takes part, even one with no split slot of its own
      const std::vector<int64_t> tokens(context.split_slots.begin() + r * U, context.split_slots.begin() + (r + 1) * U);
      at::Tensor m = ulysses_scatter_heads(inputs.narrow(0, 0, a), tokens, context.groups.ulysses);
      at::Tensor o = rule(m, u * Hk_l, Hk_l, GatedDeltaRun{*index, context.groups.ring});
      parts.push_back(ulysses_gather_heads(o, tokens, context.groups.ulysses));  // [a, Hv, V]
    }
    if (whole)  // a whole segment starts at home: no state, no conv context, every head
      parts.push_back(rule(inputs.narrow(0, a, T_l - a), 0, h.key_heads, GatedDeltaRun{*whole, dist::GroupPtr()}));
  }
  return parts.empty()       ? at::zeros({T_l, h.value_heads, h.value_dim}, inputs.options())
         : parts.size() == 1 ? parts[0]
                             : at::cat(parts, 0);
}

}  // namespace mmsp::attention
