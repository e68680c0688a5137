// The attention of one step on this rank, planned once from the plan's layouts and
// shared by every decoder layer, forward and backward (and by a recomputed layer's
// second forward): the context groups, every ring share's layout, the local kernel's
// block schedules and masks (this rank's share's queries against each share's keys)
// and, for Gated DeltaNet layers, the ring runs with their index tensors (conv halo and
// taps, chunk slots). attention_function() turns it into the
// softmax attention the mesh selects (local, Ulysses, ring or hybrid: Ulysses inside
// each ring rank, ring across), which the decoder calls without knowing the scheme.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "mmsp/attention/context_attention.h"
#include "mmsp/attention/linear/gated_delta_ring.h"
#include "mmsp/attention/ring_attention.h"

namespace mmsp::attention {

// A mixed placement (docs/plan.md "Placement"): on context rank c the first split_slots[c]
// slots hold split segments, the rest whole ones (and padding). Then only the split slots
// take part in the exchanges — a Ulysses all-to-all-v and a ring over the split shares —
// and the whole slots attend among themselves on their own rank, with every head.
struct StepAttention {
  ContextGroups groups;
  std::vector<TokenLayout> ring_shares;  // [ring rank]: the layout of its share (every slot)
  AttentionOptions options;
  // this rank's (split) share against every (split) share; null when no segment is split
  c10::intrusive_ptr<RingKernels> kernels;
  std::vector<int64_t> split_slots;  // [context rank]; empty: every slot is exchanged
  KernelPlanPtr whole;               // my whole slots against themselves; null unless mixed
  // Gated DeltaNet's runs and index, null unless asked for: over the shares, or, mixed, over
  // the split shares (null when nothing is split) and this rank's whole slots alone
  std::shared_ptr<const RingRunIndex> linear, linear_whole;

  bool mixed() const { return !split_slots.empty(); }
};

// Ring rank r's split share (the first split_slots of each of its U ulysses ranks, joined),
// for every ring rank; and the layout of one context rank's whole slots (after its split ones).
std::vector<TokenLayout> split_shares(const std::vector<TokenLayout>& ring_shares,
                                      const std::vector<int64_t>& split_slots, int ulysses);
TokenLayout whole_slots(const std::vector<TokenLayout>& ring_shares, const std::vector<int64_t>& split_slots,
                        int ulysses, int ring_rank, int ulysses_rank);

// What Gated DeltaNet's index work depends on besides the shares (hybrid decoders).
struct LinearAttentionShape {
  int64_t conv_kernel = 4;           // linear_conv_kernel_dim (W)
  int64_t chunk = kGatedDeltaChunk;  // the kernel's chunk
};

// Plans the step (checks the shares first, naming the bad value); the masks and index
// tensors are made on `device`. linear: also plan Gated DeltaNet's ring runs and index
// (over every slot: its layers exchange them all). split_slots: [context rank] the split
// slots of a mixed placement (plan::ShardMap::split_slots), empty for zigzag.
std::shared_ptr<const StepAttention> plan_step_attention(const ContextGroups& groups,
                                                         std::vector<TokenLayout> ring_shares,
                                                         const AttentionOptions& options, const at::Device& device,
                                                         std::optional<LinearAttentionShape> linear = std::nullopt,
                                                         std::vector<int64_t> split_slots = {});

// q [T/S, H, D], k/v [T/S, H_kv, D] -> [T/S, H, D], the mesh's scheme over the step's plans:
// one autograd function over step_attention_forward and _backward below.
using AttentionFunction = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;
AttentionFunction attention_function(std::shared_ptr<const StepAttention> step);

// The same forward and backward apart, without autograd (the torch.library op, whose backward
// must not run the forward again): the forward's output and the tensors its backward reads
// (10 for a mixed placement, 5 otherwise; empty ones where a part is absent); the backward's
// dq, dk, dv in the inputs' dtype. kv_heads: k's heads (the Ulysses repeats fold back to them).
struct AttentionForward {
  at::Tensor out;
  std::vector<at::Tensor> saved;
};
AttentionForward step_attention_forward(const StepAttention& step, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v);
AttentionGrads step_attention_backward(const StepAttention& step, const at::Tensor& dout,
                                       const std::vector<at::Tensor>& saved, int64_t kv_heads);

}  // namespace mmsp::attention
