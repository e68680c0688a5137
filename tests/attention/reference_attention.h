// Test references for attention: a naive full-matrix masked softmax attention
// (autograd supplies its gradients) and packed-batch layouts.
#pragma once

#include <ATen/ATen.h>

#include <random>
#include <vector>

#include "mmsp/attention/token_layout.h"

namespace mmsp::test {

// out [Tq, H, D], lse [Tq, H]; GQA by repeating K/V heads; rows with no allowed key
// give out 0 and lse -inf, with finite gradients.
struct NaiveResult {
  at::Tensor out, lse;
};

inline at::Tensor naive_mask(const attention::TokenLayout& q, const attention::TokenLayout& k,
                             bool causal) {
  at::Tensor mask = q.segment.unsqueeze(1).eq(k.segment.unsqueeze(0)) &
                    k.segment.unsqueeze(0).ge(0);
  if (causal) mask = mask & k.order.unsqueeze(0).le(q.order.unsqueeze(1));
  return mask;  // [Tq, Tk]
}

inline NaiveResult naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const attention::TokenLayout& ql,
                                   const attention::TokenLayout& kl, bool causal) {
  const int64_t G = q.size(1) / k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  at::Tensor kr = k.repeat_interleave(G, 1), vr = v.repeat_interleave(G, 1);
  at::Tensor s = at::einsum("qhd,khd->hqk", {q, kr}) * scale;  // [H, Tq, Tk]
  at::Tensor mask = naive_mask(ql, kl, causal).unsqueeze(0);   // [1, Tq, Tk]
  at::Tensor has_keys = mask.any(-1, /*keepdim=*/true);        // [1, Tq, 1]
  s = s.masked_fill(mask.logical_not(), -INFINITY).masked_fill(has_keys.logical_not(), 0);
  at::Tensor lse = s.logsumexp(-1, true);
  at::Tensor p = (s - lse).exp() * has_keys;
  at::Tensor out = at::einsum("hqk,khd->qhd", {p, vr});
  at::Tensor lse_out =
      at::where(has_keys, lse, at::full({}, -INFINITY, lse.options())).squeeze(-1).t();
  return {out, lse_out};
}

// A packed batch: segments of the given lengths, each padded at its end to a
// multiple of `pad_to` with padding tokens (segment -1).
inline attention::TokenLayout packed_layout(const std::vector<int64_t>& lengths, int64_t pad_to) {
  std::vector<int64_t> seg, ord;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t padded = (lengths[s] + pad_to - 1) / pad_to * pad_to;
    for (int64_t i = 0; i < padded; ++i) {
      seg.push_back(i < lengths[s] ? static_cast<int64_t>(s) : -1);
      ord.push_back(i);
    }
  }
  auto t = [](const std::vector<int64_t>& x) {
    return at::tensor(at::ArrayRef<int64_t>(x), at::kLong).clone();
  };
  return {t(seg), t(ord)};
}

inline std::vector<int64_t> random_lengths(std::mt19937& rng, int count, int max_length) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < count; ++i)
    lengths.push_back(std::uniform_int_distribution<int>(1, max_length)(rng));
  return lengths;
}

}  // namespace mmsp::test
