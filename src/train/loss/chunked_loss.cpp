// The chunked LM head + cross-entropy as one autograd Function; see chunked_loss.h.
#include "mmsp/train/loss/chunked_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>

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

// Vocabulary rows per block: a block of all T tokens holds as many logits as `chunk`
// tokens of the whole vocabulary.
int64_t block_rows(int64_t chunk, int64_t T, int64_t V) {
  return std::max<int64_t>(1, std::min(V, chunk * V / std::max<int64_t>(T, 1)));
}

struct ChunkedLmLoss : torch::autograd::Function<ChunkedLmLoss> {
  // By blocks of vocabulary rows over all T tokens, the log-sum-exp kept as a running
  // maximum and sum (the weight is read once, not once per token chunk).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t label_count, int64_t chunk) {
    const int64_t T = hidden.size(0), V = weight.size(0);
    const at::ScalarType wide = wide_of(hidden);
    const auto options = hidden.options().dtype(wide);
    at::Tensor top = at::full({T}, -std::numeric_limits<double>::infinity(), options);  // running max
    at::Tensor total = at::zeros({T}, options);   // Σ exp(logit − top)
    at::Tensor target = at::zeros({T}, options);  // the label's logit
    const at::Tensor label = labels.clamp_min(0).unsqueeze(1);  // [T, 1]
    const int64_t rows = block_rows(chunk, T, V);
    for (int64_t first = 0; first < V; first += rows) {
      const int64_t n = std::min(rows, V - first);
      const at::Tensor logits = at::linear(hidden, weight.narrow(0, first, n)).to(wide);  // [T, n]
      const at::Tensor next = at::maximum(top, std::get<0>(logits.max(1)));
      total = total * (top - next).exp() + (logits - next.unsqueeze(1)).exp().sum(1);
      top = next;
      const at::Tensor in_block = (label >= first) & (label < first + n);
      const at::Tensor picked = logits.gather(1, (label - first).clamp(0, n - 1));
      target += at::where(in_block, picked, at::zeros_like(picked)).squeeze(1);
    }
    const at::Tensor lse = top + total.log();  // [T]
    const at::Tensor valid = labels != kIgnore;
    const at::Tensor sum = at::where(valid, lse - target, at::zeros_like(lse)).sum();
    ctx->save_for_backward({hidden, weight, labels, lse});
    ctx->saved_data["label_count"] = label_count;
    ctx->saved_data["chunk"] = chunk;
    return sum / static_cast<double>(label_count);
  }

  // d loss / d logits = (softmax - onehot(label)) · g / label_count on labelled rows.
  // By blocks of vocabulary rows, each over all T tokens (as many logits as one token
  // chunk holds): a block's rows of the weight's gradient are complete at once and go
  // to the weight's dtype, so the gradient is never whole in the wide dtype (1 GB for
  // Qwen3.5's 248,320 × 1024 head in fp32 beside its bf16 result), nor read and written
  // whole once per chunk. The hidden state's gradient sums over the blocks, wide.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &labels = saved[2], &lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::ScalarType wide = lse.scalar_type();
    const at::Tensor scale = grads[0].to(wide) / static_cast<double>(ctx->saved_data["label_count"].toInt());
    const int64_t T = hidden.size(0), V = weight.size(0);
    const int64_t rows = block_rows(chunk, T, V);
    const at::Tensor valid = (labels != kIgnore).to(wide).unsqueeze(1) * scale;  // [T, 1]: the loss's weight
    const at::Tensor target = labels.clamp_min(0).unsqueeze(1);                    // [T, 1]
    const at::Tensor lse_t = lse.unsqueeze(1);
    // bf16 / fp16 runs multiply d in the compute dtype (oneDNN, several times fp32's
    // speed; the products accumulate in fp32 inside, one rounding per block), as the
    // logits were made; fp32 and fp64 runs stay in their own width.
    const bool narrow = hidden.scalar_type() != wide;
    at::Tensor grad_hidden = at::zeros(hidden.sizes(), hidden.options().dtype(wide));
    at::Tensor grad_weight = at::empty_like(weight);
    for (int64_t first = 0; first < V; first += rows) {
      const int64_t n = std::min(rows, V - first);
      const at::Tensor w = weight.narrow(0, first, n);
      at::Tensor d = (at::linear(hidden, w).to(wide) - lse_t).exp_();  // [T, n]: softmax
      // − 1 at each token's label when it falls in this block
      const at::Tensor in_block = (target >= first) & (target < first + n);
      d.scatter_add_(1, (target - first).clamp(0, n - 1), -in_block.to(wide));
      d.mul_(valid);
      const at::Tensor dd = narrow ? d.to(hidden.scalar_type()) : d;
      grad_hidden.add_(at::matmul(dd, w));
      grad_weight.narrow(0, first, n).copy_(at::matmul(dd.t(), hidden));
    }
    return {grad_hidden.to(hidden.scalar_type()), grad_weight, at::Tensor(), at::Tensor(), at::Tensor()};
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
