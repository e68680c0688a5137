// The attention of one step on this rank, planned once from the plan's layouts and
// shared by every decoder layer, forward and backward (and by a recomputed layer's
// second forward): the context groups, every ring share's layout, the local kernel's
// block schedules and masks (this rank's share's queries against each share's keys)
// and, for Gated DeltaNet layers, the ring runs. attention_function() turns it into the
// softmax attention the mesh selects (local, Ulysses, ring or hybrid: Ulysses inside
// each ring rank, ring across), which the decoder calls without knowing the scheme.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "mmsp/attention/context_attention.h"
#include "mmsp/attention/gated_delta_ring.h"
#include "mmsp/attention/ring_attention.h"

namespace mmsp::attention {

struct StepAttention {
  ContextGroups groups;
  std::vector<TokenLayout> ring_shares;  // [ring rank]: the layout of its share
  AttentionOptions options;
  c10::intrusive_ptr<RingKernels> kernels;  // this rank's share against every share
  std::shared_ptr<const RingRuns> linear_runs;  // Gated DeltaNet's runs; null unless asked for
};

// Plans the step (checks the shares first, naming the bad value); the masks are made on
// `device`. linear_runs: also plan Gated DeltaNet's ring runs (hybrid decoders).
std::shared_ptr<const StepAttention> plan_step_attention(const ContextGroups& groups,
                                                         std::vector<TokenLayout> ring_shares,
                                                         const AttentionOptions& options,
                                                         const at::Device& device, bool linear_runs);

// q [T/S, H, D], k/v [T/S, H_kv, D] -> [T/S, H, D], the mesh's scheme over the step's plans.
using AttentionFunction =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;
AttentionFunction attention_function(std::shared_ptr<const StepAttention> step);

}  // namespace mmsp::attention
