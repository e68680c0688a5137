// Scheme selection and up-front validation; see context_attention.h.
#include "mmsp/attention/context_attention.h"

#include <ATen/ATen.h>

#include "mmsp/attention/ring_attention.h"
#include "mmsp/attention/ulysses_attention.h"
#include "mmsp/core/check.h"

namespace mmsp::attention {

const char* scheme_name(const ContextGroups& g) {
  const bool ring = g.ring->size() > 1, ulysses = g.ulysses->size() > 1;
  return ring && ulysses ? "hybrid" : ring ? "ring" : ulysses ? "ulysses" : "local";
}

at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const ContextGroups& groups,
                             const std::vector<TokenLayout>& ring_shares,
                             const AttentionOptions& options) {
  check_attention_inputs(q, k, v, "context_attention");
  const int R = groups.ring->size(), U = groups.ulysses->size();
  check_ulysses_heads(q.size(1), k.size(1), U);
  MMSP_CHECK(static_cast<int>(ring_shares.size()) == R, "context_attention: ",
             ring_shares.size(), " ring shares given for a ring of ", R, " ranks");
  const TokenLayout& share = ring_shares[groups.ring->rank()];
  share.check("context_attention");
  MMSP_CHECK(share.size() == q.size(0) * U, "context_attention: this rank holds ", q.size(0),
             " tokens, but its ring share of ", share.size(), " tokens split over ", U,
             " ulysses ranks gives ", share.size() / U, " (pad the share to a multiple of ", U, ")");
  for (int p = 0; p < R; ++p)
    MMSP_CHECK(ring_shares[p].size() == share.size(), "context_attention: ring rank ", p,
               " holds ", ring_shares[p].size(), " tokens, ring rank ", groups.ring->rank(),
               " holds ", share.size(), "; every ring share must have the same length");

  InnerAttention inner = [&](const at::Tensor& qg, const at::Tensor& kg, const at::Tensor& vg) {
    if (R == 1) return local_attention(qg, kg, vg, share, share, options);
    return ring_attention(qg, kg, vg, groups.ring, ring_shares, options);
  };
  return ulysses_attention(q, k, v, groups.ulysses, inner);
}

}  // namespace mmsp::attention
