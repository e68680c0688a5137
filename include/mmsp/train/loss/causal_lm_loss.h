// The language-modelling loss of one rank's step from whole logits: the per-token
// cross-entropy of its labels divided by the global label count, so that summed over
// ranks it is the mean over the whole batch. The trainer computes the same a chunk at
// a time (chunked_loss.h); this form is the reference of the tests and benchmarks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace mmsp::train {

// logits [L, vocab], labels int64 [L] (-100: no loss); softmax in fp32 for 16-bit logits.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, int64_t label_count);

}  // namespace mmsp::train
