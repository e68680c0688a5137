// The chunked LM head + cross-entropy as one autograd Function; see chunked_loss.h.
#include "mmsp/train/loss/chunked_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

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

// Both losses' forward: the log-sum-exp over vocabulary blocks as a running maximum and
// sum of exp(logit − maximum), and each token's label logit, folded a block at a time.
struct RunningLse {
  at::Tensor top, total, target;  // [T] each
  RunningLse(int64_t T, const at::TensorOptions& options)
      : top(at::full({T}, -std::numeric_limits<double>::infinity(), options)),
        total(at::zeros({T}, options)),
        target(at::zeros({T}, options)) {}
  // `logits` [T, n] in the wide dtype (−∞ where a row is padding); `at_label` [T, 1] each
  // token's label column in the block (clamped), `here` whether it is in the block.
  void fold(const at::Tensor& logits, const at::Tensor& at_label, const at::Tensor& here) {
    const at::Tensor next = at::maximum(top, std::get<0>(logits.max(1)));
    total = total * (top - next).exp() + (logits - next.unsqueeze(1)).exp_().sum(1);  // one [T, n] transient
    top = next;
    const at::Tensor picked = logits.gather(1, at_label);
    target += at::where(here, picked, at::zeros_like(picked)).squeeze(1);
  }
  // The log-sum-exp per token, and each labelled token's log-probability (label logit −
  // lse; 0 where unlabelled).
  std::pair<at::Tensor, at::Tensor> finish(const at::Tensor& labels) const {
    const at::Tensor lse = top + total.log();
    return {lse, at::where(labels != kIgnore, target - lse, at::zeros_like(lse))};
  }
};

// chunked_token_values's fold: RunningLse's maximum and sum over blocks of z = logits / T,
// with Σ exp(z − max)·z beside them (the entropy's Σ p·z), and each token's label value.
struct RunningEntropy {
  at::Tensor top, total, weighted, target;  // [T] each
  RunningEntropy(int64_t T, const at::TensorOptions& options)
      : top(at::full({T}, -std::numeric_limits<double>::infinity(), options)),
        total(at::zeros({T}, options)),
        weighted(at::zeros({T}, options)),
        target(at::zeros({T}, options)) {}
  // `z` [T, n] in the wide dtype, already divided by the temperature (−∞ where a row is
  // padding: its exp is 0 and it adds nothing to the weighted sum). Consumed: overwritten,
  // so that a block holds two [T, n] tensors (z and its exp), not five.
  void fold(at::Tensor z, const at::Tensor& at_label, const at::Tensor& here) {
    const at::Tensor picked = z.gather(1, at_label);
    target += at::where(here, picked, at::zeros_like(picked)).squeeze(1);
    const at::Tensor next = at::maximum(top, std::get<0>(z.max(1)));
    const at::Tensor rescale = (top - next).exp();
    at::Tensor e = (z - next.unsqueeze(1)).exp_();
    total = total * rescale + e.sum(1);
    // e·z, with −∞ (padding, where e = 0) made finite so that 0·z is 0, not NaN
    const double lowest =
        z.scalar_type() == at::kDouble ? std::numeric_limits<double>::lowest() : std::numeric_limits<float>::lowest();
    weighted = weighted * rescale + e.mul_(z.clamp_min_(lowest)).sum(1);
    top = next;
  }
  // [2, T]: the label's log-probability (0 where unlabelled) and the entropy; with `lse`
  // and `mean` (Σ p·z, the entropy's backward reads it) given, those too.
  at::Tensor finish(const at::Tensor& labels, at::Tensor* lse_out = nullptr, at::Tensor* mean_out = nullptr) const {
    const at::Tensor lse = top + total.log(), mean = weighted / total;
    const at::Tensor logprob = at::where(labels != kIgnore, target - lse, at::zeros_like(lse));
    if (lse_out) *lse_out = lse;
    if (mean_out) *mean_out = mean;
    return at::stack({logprob, lse - mean});
  }
};

// The backward's weight per token: d lp / d z = onehot − softmax, so a gradient g_t on
// token t's log-probability weighs its softmax − onehot by −g_t (0 where unlabelled), and
// z = logits / temperature adds 1 / temperature.
at::Tensor token_weights(const at::Tensor& grad, const at::Tensor& labels, double temperature, at::ScalarType wide) {
  at::Tensor w = at::where(labels != kIgnore, grad.to(wide).neg(), at::zeros_like(grad, wide));
  if (temperature != 1.0) w = w / temperature;
  return w.unsqueeze(1);  // [T, 1]
}

// The same block with the entropy's gradient too (an RL objective's entropy bonus): with
// a = `valid` and b = −g_H / temperature per token, d loss / d logits = a·(p − onehot) +
// b·p·(z − m), m = Σ p·z (dH/dz_j = −p_j·(z_j − m)): p·(a + b·(z − m)) − a·onehot. `z` [T, n]
// (logits / temperature, wide) is overwritten; `padding` (a row-sharded round's padding
// columns, or undefined) gets no gradient (z = −∞ there).
at::Tensor block_gradient_with_entropy(at::Tensor z, const at::Tensor& lse_t, const at::Tensor& mean_t,
                                       const at::Tensor& at_label, const at::Tensor& here, const at::Tensor& valid,
                                       const at::Tensor& entropy_weight, const at::Tensor& padding,
                                       at::ScalarType dtype) {
  at::Tensor d = (z - lse_t).exp_();                                    // [T, n]: softmax
  at::Tensor factor = z.sub_(mean_t).mul_(entropy_weight).add_(valid);  // a + b·(z − m)
  if (padding.defined()) factor.masked_fill_(padding, 0);
  d.mul_(factor);
  d.scatter_add_(1, at_label, -(here.to(d.scalar_type()) * valid));  // − a at each token's label
  return dtype != d.scalar_type() ? d.to(dtype) : d;
}

// Both heads' backward, one block: d loss / d logits = (softmax − onehot(label)) · the
// token's weight (`valid`, token_weights). `logits` [T, n] in the wide dtype (already
// divided by the temperature) is overwritten by the softmax; the result is in `dtype`
// (bf16 / fp16 runs multiply it in the compute dtype: oneDNN, several times fp32's speed,
// one rounding per block, as the logits were made; fp32 and fp64 stay in their own width).
at::Tensor block_gradient(const at::Tensor& logits, const at::Tensor& lse_t, const at::Tensor& at_label,
                          const at::Tensor& here, const at::Tensor& valid, at::ScalarType dtype) {
  at::Tensor d = (logits - lse_t).exp_();                  // [T, n]: softmax
  d.scatter_add_(1, at_label, -here.to(d.scalar_type()));  // − 1 at each token's label in this block
  d.mul_(valid);
  return dtype != d.scalar_type() ? d.to(dtype) : d;
}

// logits / temperature in the wide dtype (the division skipped at 1: the same bits).
at::Tensor wide_logits(const at::Tensor& hidden, const at::Tensor& w, double temperature) {
  at::Tensor z = at::linear(hidden, w).to(wide_of(hidden));
  return temperature != 1.0 ? z.div_(temperature) : z;
}

// What a label-value Function folds over the blocks and returns: the label log-probs [T],
// or with `entropy` the log-probs and the entropy [2, T] (and Σ p·z, the entropy's backward
// reads it).
struct LabelFold {
  std::optional<RunningLse> logprobs;
  std::optional<RunningEntropy> values;
  LabelFold(bool entropy, int64_t T, const at::TensorOptions& options) {
    if (entropy)
      values.emplace(T, options);
    else
      logprobs.emplace(T, options);
  }
  void fold(at::Tensor z, const at::Tensor& at_label, const at::Tensor& here) {
    if (values)
      values->fold(std::move(z), at_label, here);
    else
      logprobs->fold(z, at_label, here);
  }
  // The output; `lse` and `mean` (undefined without the entropy) for the backward.
  at::Tensor finish(const at::Tensor& labels, at::Tensor& lse, at::Tensor& mean) const {
    if (values) return values->finish(labels, &lse, &mean);
    at::Tensor logprob;
    std::tie(lse, logprob) = logprobs->finish(labels);
    return logprob;
  }
};

// The backward's weights per token, from the output's gradient ([T], or [2, T] with the
// entropy), and one block's gradient of the logits.
struct LabelGradient {
  at::Tensor valid, entropy_weight, lse_t, mean_t;  // [T, 1] each; the entropy's undefined without it
  LabelGradient(const at::Tensor& grad, const at::Tensor& labels, double temperature, const at::Tensor& lse,
                const at::Tensor& mean)
      : lse_t(lse.unsqueeze(1)) {
    const at::ScalarType wide = lse.scalar_type();
    if (!mean.defined()) {
      valid = token_weights(grad, labels, temperature, wide);
      return;
    }
    valid = token_weights(grad[0], labels, temperature, wide);
    entropy_weight = (grad[1].to(wide).neg() / temperature).unsqueeze(1);  // b = −g_H / T
    mean_t = mean.unsqueeze(1);
  }
  at::Tensor block(at::Tensor z, const at::Tensor& at_label, const at::Tensor& here, const at::Tensor& padding,
                   at::ScalarType dtype) const {
    if (entropy_weight.defined())
      return block_gradient_with_entropy(std::move(z), lse_t, mean_t, at_label, here, valid, entropy_weight, padding,
                                         dtype);
    return block_gradient(z, lse_t, at_label, here, valid, dtype);
  }
};

struct ChunkedLabelLogprobs : torch::autograd::Function<ChunkedLabelLogprobs> {
  // By blocks of vocabulary rows over all T tokens, the log-sum-exp kept as a running
  // maximum and sum (the weight is read once, not once per token chunk).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, double temperature, int64_t chunk, bool entropy) {
    const int64_t T = hidden.size(0), V = weight.size(0);
    LabelFold running(entropy, T, hidden.options().dtype(wide_of(hidden)));
    const at::Tensor label = labels.clamp_min(0).unsqueeze(1);  // [T, 1]
    const int64_t rows = block_rows(chunk, T, V);
    for (int64_t first = 0; first < V; first += rows) {
      const int64_t n = std::min(rows, V - first);
      const at::Tensor logits = wide_logits(hidden, weight.narrow(0, first, n), temperature);  // [T, n]
      running.fold(logits, (label - first).clamp(0, n - 1), (label >= first) & (label < first + n));
    }
    at::Tensor lse, mean;
    const at::Tensor out = running.finish(labels, lse, mean);
    ctx->save_for_backward({hidden, weight, labels, lse, mean});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    return out;
  }

  // d loss / d logits = (softmax − onehot(label)) · (−g_t) per token (token_weights). By
  // blocks of vocabulary rows, each over all T tokens (as many logits as one token chunk
  // holds): a block's rows of the weight's gradient are complete at once and go to the
  // weight's dtype, so the gradient is never whole in the wide dtype (1 GB for Qwen3.5's
  // 248,320 × 1024 head in fp32 beside its bf16 result), nor read and written whole once
  // per chunk. The hidden state's gradient sums over the blocks, wide.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &labels = saved[2], &lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const at::ScalarType wide = lse.scalar_type();
    const int64_t T = hidden.size(0), V = weight.size(0);
    const int64_t rows = block_rows(chunk, T, V);
    const LabelGradient gradient(grads[0], labels, temperature, lse, saved[4]);
    const at::Tensor target = labels.clamp_min(0).unsqueeze(1);  // [T, 1]
    at::Tensor grad_hidden = at::zeros(hidden.sizes(), hidden.options().dtype(wide));
    // A frozen head (LoRA, --freeze) gets no gradient: neither its [V, h] nor the matmuls.
    const bool weight_trains = ctx->needs_input_grad(1);
    at::Tensor grad_weight = weight_trains ? at::empty_like(weight) : at::Tensor();
    for (int64_t first = 0; first < V; first += rows) {
      const int64_t n = std::min(rows, V - first);
      const at::Tensor w = weight.narrow(0, first, n);
      const at::Tensor dd =
          gradient.block(wide_logits(hidden, w, temperature), (target - first).clamp(0, n - 1),
                         (target >= first) & (target < first + n), at::Tensor(), hidden.scalar_type());
      grad_hidden.add_(at::matmul(dd, w));
      if (weight_trains) grad_weight.narrow(0, first, n).copy_(at::matmul(dd.t(), hidden));
    }
    return {grad_hidden.to(hidden.scalar_type()), grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The head by rounds of rows (row_sharded_weight.h): round k holds, at row r·B + j, the
// table's row r·R + k·B + j when that is a row of rank r's (j < R − k·B) and of the
// table (< V); the other rows are padding, their logits −∞ (no probability, no gradient).
struct Round {
  at::Tensor ids;    // [P·B] the table row of each gathered row (long)
  at::Tensor valid;  // [P·B] bool
};

Round round_rows(const model::RowShardedWeight& head, int64_t k, int64_t block, const at::Device& device) {
  const int64_t P = head.ranks(), R = head.rows_per_rank();
  const at::Tensor j = at::arange(block, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor r = at::arange(P, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor offset = (j + k * block).unsqueeze(0).expand({P, block});  // within a rank's rows
  const at::Tensor ids = (r.unsqueeze(1) * R + offset).reshape({-1});
  return {ids, ((offset < R).reshape({-1}) & (ids < head.vocab()))};
}

// Where each token's label sits in round k ([T, 1], clamped), and whether it is there.
std::pair<at::Tensor, at::Tensor> label_in_round(const at::Tensor& label, const model::RowShardedWeight& head,
                                                 int64_t k, int64_t block) {
  const int64_t R = head.rows_per_rank();
  const at::Tensor owner = at::floor_divide(label, R), offset = label - owner * R - k * block;
  const at::Tensor here = (offset >= 0) & (offset < block);
  return {(owner * block + offset).clamp(0, head.ranks() * block - 1), here};
}

// Round k's logits / temperature in the wide dtype, −∞ on its padding rows (exp(−∞ − max)
// = 0; the maximum is finite: round 0 holds rank 0's first rows).
at::Tensor round_logits(const at::Tensor& hidden, const at::Tensor& w, const Round& round, double temperature) {
  return wide_logits(hidden, w, temperature)
      .masked_fill_(round.valid.logical_not(), -std::numeric_limits<double>::infinity());
}

// The table the node reads again in its backward (it outlives the step: the optimizer owns it).
struct HeadRef : torch::CustomClassHolder {
  explicit HeadRef(model::RowShardedWeight& head) : head(head) {}
  model::RowShardedWeight& head;
};

struct RowShardedLabelLogprobs : torch::autograd::Function<RowShardedLabelLogprobs> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& labels,
                            double temperature, int64_t block, bool entropy, const c10::intrusive_ptr<HeadRef>& ref) {
    model::RowShardedWeight* head = &ref->head;
    LabelFold running(entropy, hidden.size(0), hidden.options().dtype(wide_of(hidden)));
    const at::Tensor label = labels.clamp_min(0).unsqueeze(1);  // [T, 1]
    for (int64_t k = 0; k < head->rounds(block); ++k) {
      const at::Tensor w = head->gather_round(k, block);  // [P·B, h]
      const Round round = round_rows(*head, k, block, hidden.device());
      const auto [at_label, here] = label_in_round(label, *head, k, block);
      running.fold(round_logits(hidden, w, round, temperature), at_label, here);
    }
    at::Tensor lse, mean;
    const at::Tensor out = running.finish(labels, lse, mean);
    ctx->save_for_backward({hidden, labels, lse, mean});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["block"] = block;
    ctx->saved_data["head"] = c10::IValue::make_capsule(ref);
    return out;
  }

  // ChunkedLabelLogprobs's backward, a round at a time: each round's rows gathered again,
  // the hidden state's gradient summed over rounds, each round's weight gradient sent to
  // its rows' owners before the next round.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &labels = saved[1], &lse = saved[2];
    const int64_t block = ctx->saved_data["block"].toInt();
    const double temperature = ctx->saved_data["temperature"].toDouble();
    model::RowShardedWeight* head =
        &c10::static_intrusive_pointer_cast<HeadRef>(ctx->saved_data["head"].toCapsule())->head;
    const LabelGradient gradient(grads[0], labels, temperature, lse, saved[3]);
    const at::Tensor label = labels.clamp_min(0).unsqueeze(1);
    at::Tensor grad_hidden = at::zeros(hidden.sizes(), hidden.options().dtype(lse.scalar_type()));
    for (int64_t k = 0; k < head->rounds(block); ++k) {
      const at::Tensor w = head->gather_round(k, block);
      const Round round = round_rows(*head, k, block, hidden.device());
      const auto [at_label, here] = label_in_round(label, *head, k, block);
      const at::Tensor dd = gradient.block(round_logits(hidden, w, round, temperature), at_label, here,
                                           round.valid.logical_not(), hidden.scalar_type());
      grad_hidden.add_(at::matmul(dd, w));
      head->reduce_round(k, block, at::matmul(dd.t(), hidden));
    }
    return {grad_hidden.to(hidden.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void check_token_values(const at::Tensor& hidden, int64_t width, const at::Tensor& labels, double temperature) {
  MMSP_CHECK(std::isfinite(temperature) && temperature > 0, "--temperature ", temperature,
             " must be a finite number > 0 (the logits are divided by it)");
  MMSP_CHECK(hidden.dim() == 2 && hidden.size(1) == width, "hidden ", hidden.sizes(), " must be [T, ", width,
             "] for the LM head");
  MMSP_CHECK(labels.dim() == 1 && labels.size(0) == hidden.size(0), "labels ", labels.sizes(), " must be [",
             hidden.size(0), "] (one per token)");
}

}  // namespace

int64_t row_sharded_block(int64_t chunk, int64_t tokens_per_rank, int64_t vocab, int ranks, int64_t row_bytes,
                          int64_t logit_bytes) {
  MMSP_CHECK(chunk > 0 && tokens_per_rank > 0 && vocab > 0 && ranks > 0 && row_bytes > 0 && logit_bytes > 0,
             "row_sharded_block: chunk ", chunk, ", tokens ", tokens_per_rank, ", vocab ", vocab, ", ranks ", ranks,
             ", row bytes ", row_bytes, " and logit bytes ", logit_bytes, " must be positive");
  const int64_t per_round = block_rows(chunk, tokens_per_rank, vocab);  // rows of the whole table a round
  const int64_t by_bytes = kRowRoundBytes / (ranks * (row_bytes + tokens_per_rank * logit_bytes));
  const int64_t R = (vocab + ranks - 1) / ranks;
  return std::clamp<int64_t>(std::min((per_round + ranks - 1) / ranks, by_bytes), 1, R);
}

namespace {

// The label values (with or without the entropy) through each kind of head, checked first.
at::Tensor label_values(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                        double temperature, int64_t chunk, bool entropy) {
  MMSP_CHECK(chunk > 0, "--loss-chunk ", chunk, " must be positive (tokens per chunk of the LM head)");
  MMSP_CHECK(weight.dim() == 2, "LM head weight ", weight.sizes(), " must be [V, h]");
  check_token_values(hidden, weight.size(1), labels, temperature);
  return ChunkedLabelLogprobs::apply(hidden, weight, labels, temperature, chunk, entropy);
}

at::Tensor label_values(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                        double temperature, int64_t block, bool entropy) {
  MMSP_CHECK(block > 0, "a row-sharded head is read in rounds of at least one row, not ", block);
  check_token_values(hidden, head.width(), labels, temperature);
  return RowShardedLabelLogprobs::apply(hidden, labels, temperature, block, entropy,
                                        c10::make_intrusive<HeadRef>(head));
}

}  // namespace

at::Tensor chunked_label_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                  double temperature, int64_t chunk) {
  return label_values(hidden, weight, labels, temperature, chunk, false);
}

at::Tensor chunked_label_logprobs(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                                  double temperature, int64_t block) {
  return label_values(hidden, head, labels, temperature, block, false);
}

at::Tensor chunked_label_values(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                double temperature, int64_t chunk) {
  return label_values(hidden, weight, labels, temperature, chunk, true);
}

at::Tensor chunked_label_values(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                                double temperature, int64_t block) {
  return label_values(hidden, head, labels, temperature, block, true);
}

// −Σ log p / label_count: the same bits as summing lse − label logit (negation is exact).
at::Tensor chunked_lm_loss(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                           int64_t label_count, int64_t block) {
  MMSP_CHECK(label_count > 0, "the batch has no label tokens: nothing to learn from (check loss_mask)");
  return chunked_label_logprobs(hidden, head, labels, 1.0, block).sum().neg() / static_cast<double>(label_count);
}

at::Tensor chunked_lm_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                           int64_t label_count, int64_t chunk) {
  MMSP_CHECK(label_count > 0, "the batch has no label tokens: nothing to learn from (check loss_mask)");
  return chunked_label_logprobs(hidden, weight, labels, 1.0, chunk).sum().neg() / static_cast<double>(label_count);
}

at::Tensor chunked_token_values(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                double temperature, int64_t chunk) {
  MMSP_CHECK(chunk > 0, "--loss-chunk ", chunk, " must be positive (tokens per chunk of the LM head)");
  MMSP_CHECK(weight.dim() == 2, "LM head weight ", weight.sizes(), " must be [V, h]");
  check_token_values(hidden, weight.size(1), labels, temperature);
  at::NoGradGuard no_grad;
  const int64_t T = hidden.size(0), V = weight.size(0);
  RunningEntropy running(T, hidden.options().dtype(wide_of(hidden)));
  const at::Tensor label = labels.clamp_min(0).unsqueeze(1);  // [T, 1]
  const int64_t rows = block_rows(chunk, T, V);
  for (int64_t first = 0; first < V; first += rows) {
    const int64_t n = std::min(rows, V - first);
    running.fold(wide_logits(hidden, weight.narrow(0, first, n), temperature), (label - first).clamp(0, n - 1),
                 (label >= first) & (label < first + n));
  }
  return running.finish(labels);
}

at::Tensor chunked_token_values(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                                double temperature, int64_t block) {
  MMSP_CHECK(block > 0, "a row-sharded head is read in rounds of at least one row, not ", block);
  check_token_values(hidden, head.width(), labels, temperature);
  at::NoGradGuard no_grad;
  RunningEntropy running(hidden.size(0), hidden.options().dtype(wide_of(hidden)));
  const at::Tensor label = labels.clamp_min(0).unsqueeze(1);  // [T, 1]
  for (int64_t k = 0; k < head.rounds(block); ++k) {
    const at::Tensor w = head.gather_round(k, block);  // [P·B, h]
    const Round round = round_rows(head, k, block, hidden.device());
    const auto [at_label, here] = label_in_round(label, head, k, block);
    running.fold(round_logits(hidden, w, round, temperature), at_label, here);
  }
  return running.finish(labels);
}

}  // namespace mmsp::train
