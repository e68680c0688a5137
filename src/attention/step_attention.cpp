// The step's attention, planned once; see step_attention.h.
#include "mmsp/attention/step_attention.h"

#include <ATen/ATen.h>

#include <utility>

#include "mmsp/attention/ulysses_attention.h"
#include "mmsp/core/check.h"

namespace mmsp::attention {

std::shared_ptr<const StepAttention> plan_step_attention(const ContextGroups& groups,
                                                         std::vector<TokenLayout> ring_shares,
                                                         const AttentionOptions& options, const at::Device& device,
                                                         std::optional<LinearAttentionShape> linear) {
  const int R = groups.ring->size();
  MMSP_CHECK(static_cast<int>(ring_shares.size()) == R, "context_attention: ", ring_shares.size(),
             " ring shares given for a ring of ", R, " ranks");
  auto step = std::make_shared<StepAttention>();
  step->groups = groups;
  step->options = options;
  step->kernels = plan_ring_kernels(ring_shares, groups.ring->rank(), options, device);
  if (linear)
    step->linear = std::make_shared<const RingRunIndex>(RingRunIndex::make(
        ring_shares, groups.ring->rank(), linear->conv_kernel, linear->chunk, device));
  step->ring_shares = std::move(ring_shares);
  return step;
}

AttentionFunction attention_function(std::shared_ptr<const StepAttention> step) {
  return [step = std::move(step)](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const StepAttention& s = *step;
    check_attention_inputs(q, k, v, "context_attention");
    const int R = s.groups.ring->size(), U = s.groups.ulysses->size();
    check_ulysses_heads(q.size(1), k.size(1), U);
    const int64_t share = s.kernels->from[0]->queries;
    MMSP_CHECK(share == q.size(0) * U, "context_attention: this rank holds ", q.size(0),
               " tokens, but its ring share of ", share, " tokens split over ", U, " ulysses ranks gives ",
               share / U, " (pad the share to a multiple of ", U, ")");
    InnerAttention inner = [&](const at::Tensor& qg, const at::Tensor& kg, const at::Tensor& vg) {
      if (R == 1) return local_attention(qg, kg, vg, s.kernels->from[0]);
      return ring_attention(qg, kg, vg, s.groups.ring, s.kernels);
    };
    return ulysses_attention(q, k, v, s.groups.ulysses, inner);
  };
}

}  // namespace mmsp::attention
