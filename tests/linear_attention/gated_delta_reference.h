// The references for Gated DeltaNet, written plainly and apart from the library:
// the token-by-token recurrence, and the whole layer on the unsharded packed batch
// (Hugging Face's Qwen3NextGatedDeltaNet, one token at a time). Slow by design.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "mmsp/attention/gated_deltanet_layer.h"
#include "mmsp/attention/token_layout.h"

namespace mmsp::test {

// q, k [T, H, K], v [T, H, V], g, beta [T, H]; the state restarts wherever a token's
// order is 0 or its segment changes; padding tokens (segment < 0) get zero output
// and leave the state alone.
//   S_t = exp(g_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t / √K
inline at::Tensor gated_delta_recurrence(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& g, const at::Tensor& beta,
                                         const attention::TokenLayout& layout) {
  const int64_t T = q.size(0), H = q.size(1), K = q.size(2), V = v.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  const int64_t* seg = layout.segment.data_ptr<int64_t>();
  const int64_t* ord = layout.order.data_ptr<int64_t>();
  at::Tensor eye = at::eye(K, q.options()).expand({H, K, K});
  at::Tensor S;
  int64_t prev_seg = -1;
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < T; ++t) {
    if (seg[t] < 0) {
      out.push_back(at::zeros({H, V}, v.options()));
      continue;
    }
    if (ord[t] == 0 || seg[t] != prev_seg) S = at::zeros({H, K, V}, q.options());
    prev_seg = seg[t];
    at::Tensor kt = k[t].unsqueeze(-1);                                   // [H, K, 1]
    at::Tensor alpha = g[t].exp().view({H, 1, 1}), b = beta[t].view({H, 1, 1});
    at::Tensor transition = alpha * (eye - b * at::matmul(kt, kt.transpose(-1, -2)));  // [H, K, K]
    S = at::matmul(transition, S) + b * at::matmul(kt, v[t].unsqueeze(-2));
    out.push_back(at::matmul(S.transpose(-1, -2), q[t].unsqueeze(-1) * scale).squeeze(-1));
  }
  return at::stack(out);
}

// The layer on the whole packed batch x [T, hidden] laid out by `layout`.
inline at::Tensor gated_deltanet_reference(const attention::GatedDeltaNetWeights& w,
                                           const attention::GatedDeltaNetConfig& c, const at::Tensor& x,
                                           const attention::TokenLayout& layout) {
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
  at::Tensor o = gated_delta_recurrence(q, k, v, g, at::sigmoid(b), layout);
  at::Tensor var = o.pow(2).mean(-1, true);
  at::Tensor normed = o / at::sqrt(var + c.rms_norm_eps) * w.norm_weight * (z * at::sigmoid(z));
  return at::matmul(normed.reshape({T, Hv * V}), w.out_proj.t());
}

}  // namespace mmsp::test
