// The chunked LM head + cross-entropy as one autograd Function; see chunked_loss.h.
#include "mmsp/train/chunked_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "mmsp/core/check.h"

namespace mmsp::train {

int64_t default_loss_chunk(int64_t vocab_size) {
  MMSP_CHECK(vocab_size > 0, "vocab_size ", vocab_size, " must be positive");
  return std::max<int64_t>(1, (int64_t{256} << 20) / (4 * vocab_size));
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
constexpr int64_t kIgnore = -100;

at::ScalarType wide_of(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// logits of rows [start, start + n): [n, V] in the wide dtype
at::Tensor chunk_logits(const at::Tensor& hidden, const at::Tensor& weight, int64_t start, int64_t n) {
  return at::linear(hidden.narrow(0, start, n), weight).to(wide_of(hidden));
}

struct ChunkedLmLoss : torch::autograd::Function<ChunkedLmLoss> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t label_count, int64_t chunk) {
    const int64_t T = hidden.size(0);
    const at::ScalarType wide = wide_of(hidden);
    at::Tensor lse = at::empty({T}, hidden.options().dtype(wide));  // [T]
    at::Tensor sum = at::zeros({}, hidden.options().dtype(wide));
    for (int64_t start = 0; start < T; start += chunk) {
      const int64_t n = std::min(chunk, T - start);
      const at::Tensor logits = chunk_logits(hidden, weight, start, n);  // [n, V]
      const at::Tensor y = labels.narrow(0, start, n);
      const at::Tensor valid = y != kIgnore;
      const at::Tensor l = at::logsumexp(logits, 1);  // [n]
      const at::Tensor target = logits.gather(1, y.clamp_min(0).unsqueeze(1)).squeeze(1);
      sum += at::where(valid, l - target, at::zeros_like(l)).sum();
      lse.narrow(0, start, n).copy_(l);
    }
    ctx->save_for_backward({hidden, weight, labels, lse});
    ctx->saved_data["label_count"] = label_count;
    ctx->saved_data["chunk"] = chunk;
    return sum / static_cast<double>(label_count);
  }

  // d loss / d logits = (softmax - onehot(label)) · g / label_count on labelled rows.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &labels = saved[2], &lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor scale = grads[0].to(lse.scalar_type()) / static_cast<double>(ctx->saved_data["label_count"].toInt());
    const int64_t T = hidden.size(0);
    at::Tensor grad_hidden = at::empty_like(hidden);
    at::Tensor grad_weight = at::zeros(weight.sizes(), weight.options().dtype(lse.scalar_type()));  // summed wide
    for (int64_t start = 0; start < T; start += chunk) {
      const int64_t n = std::min(chunk, T - start);
      const at::Tensor y = labels.narrow(0, start, n);
      const at::Tensor valid = (y != kIgnore).to(lse.scalar_type()).unsqueeze(1);  // [n, 1]
      at::Tensor d = (chunk_logits(hidden, weight, start, n) - lse.narrow(0, start, n).unsqueeze(1)).exp_();
      d.scatter_add_(1, y.clamp_min(0).unsqueeze(1), -valid);
      d.mul_(valid * scale);  // [n, V]: d loss / d logits, wide
      const at::Tensor h = hidden.narrow(0, start, n);
      grad_hidden.narrow(0, start, n).copy_(at::matmul(d.to(hidden.scalar_type()), weight));
      grad_weight.addmm_(d.t(), h.to(d.scalar_type()));
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_lm_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                           int64_t label_count, int64_t chunk) {
  MMSP_CHECK(label_count > 0, "the batch has no label tokens: nothing to learn from (check loss_mask)");
  MMSP_CHECK(chunk > 0, "--loss-chunk ", chunk, " must be positive (tokens per chunk of the LM head)");
  MMSP_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
             "hidden ", hidden.sizes(), " and LM head weight ", weight.sizes(), " must be [T, h] and [V, h]");
  MMSP_CHECK(labels.dim() == 1 && labels.size(0) == hidden.size(0), "labels ", labels.sizes(),
             " must be [", hidden.size(0), "] (one per token)");
  return ChunkedLmLoss::apply(hidden, weight, labels, label_count, chunk);
}

}  // namespace mmsp::train
