// Scheme selection for a single call; see context_attention.h. Model code plans the
// step once instead (step_attention.h).
#include "mmsp/attention/context_attention.h"

#include "mmsp/attention/step_attention.h"

namespace mmsp::attention {

const char* scheme_name(const ContextGroups& g) {
  const bool ring = g.ring->size() > 1, ulysses = g.ulysses->size() > 1;
  return ring && ulysses ? "hybrid" : ring ? "ring" : ulysses ? "ulysses" : "local";
}

at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextGroups& groups,
                             const std::vector<TokenLayout>& ring_shares, const AttentionOptions& options,
                             const std::vector<int64_t>& split_slots) {
  check_attention_inputs(q, k, v, "context_attention");
  return attention_function(plan_step_attention(groups, ring_shares, options, q.device(), std::nullopt, split_slots))(
      q, k, v);
}

}  // namespace mmsp::attention
