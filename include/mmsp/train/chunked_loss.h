// The LM head and the cross-entropy together, a chunk of tokens at a time: the forward
// keeps per token only the log-sum-exp of its logits, never the [tokens, vocab] logits;
// the backward makes each chunk's logits again. Equals
// train::causal_lm_loss(hidden · weightᵀ, labels, label_count) in value and gradient (tests).
// With V the vocabulary, a chunk of n tokens holds n·V logits in the compute dtype and
// about three n·V tensors in fp32 (its upcast, exp, gradient) at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace mmsp::train {

// Tokens per chunk such that one chunk's fp32 logits take at most 256 MiB:
// floor(256 MiB / (4·V)), at least 1.
int64_t default_loss_chunk(int64_t vocab_size);

// Sum over this rank's tokens of -log softmax(hidden·weightᵀ)[label], divided by the
// global label count (summed over ranks it is the mean over the batch). Labels -100
// take no loss. hidden [T, h] and weight [V, h] in the compute dtype (weight is the
// embedding when tied: its gradient adds to the embedding's); logits are upcast to fp32
// (fp64 for fp64) for the log-sum-exp and softmax, and the weight's gradient is summed
// over chunks in that width. Returns a 0-dim tensor in that width.
at::Tensor chunked_lm_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                           int64_t label_count, int64_t chunk);

}  // namespace mmsp::train
