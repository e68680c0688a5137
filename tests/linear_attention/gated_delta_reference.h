// The reference for the Gated DeltaNet layer, written plainly and apart from the
// library: the whole layer on the unsharded packed batch (Hugging Face's
// Qwen3NextGatedDeltaNet, one token at a time). Its rule is the library's plain
// token-by-token recurrence (attention/gated_delta_recurrence.h). Slow by design.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "mmsp/attention/linear/gated_delta_recurrence.h"
#include "mmsp/attention/token_layout.h"
#include "mmsp/model/layers/gated_deltanet_layer.h"

namespace mmsp::test {

// The layer on the whole packed batch x [T, hidden] laid out by `layout`.
inline at::Tensor gated_deltanet_reference(const model::GatedDeltaNetWeights& w, const model::GatedDeltaNetConfig& c,
                                           const at::Tensor& x, const attention::TokenLayout& layout) {
  const int64_t T = x.size(0), Hk = c.num_key_heads, Hv = c.num_value_heads;
  const int64_t K = c.key_head_dim, V = c.value_head_dim, n = Hv / Hk, W = c.conv_kernel;
  const int64_t* seg = layout.segment.data_ptr<int64_t>();
  const int64_t* ord = layout.order.data_ptr<int64_t>();
  // fix_query_key_value_ordering: per key head [q | k | v (n heads) | z (n heads)], [b (n) | a (n)]
  at::Tensor qkvz = at::matmul(x, w.in_proj_qkvz.t()).view({T, Hk, 2 * K + 2 * n * V});
  at::Tensor ba = at::matmul(x, w.in_proj_ba.t()).view({T, Hk, 2 * n});
  auto parts = at::split_with_sizes(qkvz, {K, K, n * V, n * V}, 2);
  at::Tensor z = parts[3].reshape({T, Hv, V});
  at::Tensor b = ba.narrow(2, 0, n).reshape({T, Hv}), a = ba.narrow(2, n, n).reshape({T, Hv});
  at::Tensor mixed = at::cat({parts[0].reshape({T, -1}), parts[1].reshape({T, -1}), parts[2].reshape({T, -1})}, 1);
  // Causal depthwise conv within each segment (F.conv1d with left padding W − 1), SiLU.
  at::Tensor wc = w.conv1d_weight.squeeze(1);  // [Ch, W]
  std::vector<at::Tensor> conv_rows;
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor acc = at::zeros({mixed.size(1)}, x.options());
    for (int64_t j = 0; j < W; ++j) {
      const int64_t src = t - (W - 1) + j;
      if (seg[t] < 0 || src < 0 || seg[src] != seg[t] || ord[src] != ord[t] - (W - 1 - j)) continue;
      acc = acc + wc.select(1, j) * mixed[src];
    }
    conv_rows.push_back(at::silu(acc));
  }
  mixed = at::stack(conv_rows);
  auto l2 = [](const at::Tensor& t) { return t / at::sqrt(t.pow(2).sum(-1, true) + 1e-6); };
  at::Tensor q = l2(mixed.narrow(1, 0, Hk * K).view({T, Hk, K})).repeat_interleave(n, 1);
  at::Tensor k = l2(mixed.narrow(1, Hk * K, Hk * K).view({T, Hk, K})).repeat_interleave(n, 1);
  at::Tensor v = mixed.narrow(1, 2 * Hk * K, Hv * V).view({T, Hv, V});
  at::Tensor g = -w.A_log.exp() * at::log1p(at::exp(a + w.dt_bias));  // softplus
  at::Tensor o = attention::gated_delta_recurrence(q, k, v, g, at::sigmoid(b), layout);
  at::Tensor var = o.pow(2).mean(-1, true);
  at::Tensor normed = o / at::sqrt(var + c.rms_norm_eps) * w.norm_weight * (z * at::sigmoid(z));
  return at::matmul(normed.reshape({T, Hv * V}), w.out_proj.t());
}

}  // namespace mmsp::test
