// The token-by-token Gated DeltaNet recurrence; see gated_delta_recurrence.h.
#include "mmsp/attention/linear/gated_delta_recurrence.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

namespace mmsp::attention {

at::Tensor gated_delta_recurrence(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const at::Tensor& beta, const TokenLayout& layout) {
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
    at::Tensor kt = k[t].unsqueeze(-1);  // [H, K, 1]
    at::Tensor alpha = g[t].exp().view({H, 1, 1}), b = beta[t].view({H, 1, 1});
    at::Tensor transition = alpha * (eye - b * at::matmul(kt, kt.transpose(-1, -2)));  // [H, K, K]
    S = at::matmul(transition, S) + b * at::matmul(kt, v[t].unsqueeze(-2));
    out.push_back(at::matmul(S.transpose(-1, -2), q[t].unsqueeze(-1) * scale).squeeze(-1));
  }
  return at::stack(out);
}

}  // namespace mmsp::attention
