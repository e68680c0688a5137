// Cross-entropy over this rank's labels; see causal_lm_loss.h.
#include "mmsp/train/loss/causal_lm_loss.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"

namespace mmsp::train {

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, int64_t label_count) {
  MMSP_CHECK(label_count > 0, "the batch has no label tokens: nothing to learn from (check loss_mask)");
  const at::ScalarType wide = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor log_probs = at::log_softmax(logits.to(wide), 1);
  return at::nll_loss(log_probs, labels, {}, at::Reduction::Sum, -100) / static_cast<double>(label_count);
}

}  // namespace mmsp::train
