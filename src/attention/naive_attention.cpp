// Full-matrix reference attention; see naive_attention.h.
#include "mmsp/attention/naive_attention.h"

#include <ATen/ATen.h>

#include <cmath>

namespace mmsp::attention {

at::Tensor attention_mask(const TokenLayout& q, const TokenLayout& k, bool causal) {
  at::Tensor mask = q.segment.unsqueeze(1).eq(k.segment.unsqueeze(0)) & k.segment.unsqueeze(0).ge(0);
  if (causal) mask = mask & k.order.unsqueeze(0).le(q.order.unsqueeze(1));
  return mask;
}

NaiveAttention naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const TokenLayout& q_layout, const TokenLayout& k_layout, bool causal) {
  const int64_t G = q.size(1) / k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  at::Tensor kr = k.repeat_interleave(G, 1), vr = v.repeat_interleave(G, 1);
  at::Tensor s = at::einsum("qhd,khd->hqk", {q, kr}) * scale;  // [H, Tq, Tk]
  at::Tensor mask = attention_mask(q_layout, k_layout, causal).to(q.device()).unsqueeze(0);
  at::Tensor has_keys = mask.any(-1, /*keepdim=*/true);  // [1, Tq, 1]
  // Rows with no key: scores 0 (finite lse, finite gradients), then weights 0.
  s = s.masked_fill(mask.logical_not(), -INFINITY).masked_fill(has_keys.logical_not(), 0);
  at::Tensor lse = s.logsumexp(-1, /*keepdim=*/true);
  at::Tensor p = (s - lse).exp() * has_keys;
  at::Tensor out = at::einsum("hqk,khd->qhd", {p, vr});
  at::Tensor lse_out = at::where(has_keys, lse, at::full({}, -INFINITY, lse.options())).squeeze(-1).t();
  return {out, lse_out};
}

}  // namespace mmsp::attention
