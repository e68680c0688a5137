// The LM head and the cross-entropy together, a block of the vocabulary at a time: the
// forward keeps per token only the log-sum-exp of its logits (a running maximum and sum
// over the blocks), never the [tokens, vocab] logits; the backward makes each block's
// logits again. Equals train::causal_lm_loss(hidden · weightᵀ, labels, label_count) in
// value and gradient (tests). A block is all T tokens by n·V/T vocabulary rows, with n
// = --loss-chunk: as many logits as n tokens of the whole vocabulary, in the compute
// dtype and about three such tensors in fp32 (upcast, exp, gradient) at a time. The
// weight is read once per pass, and each block's rows of its gradient are complete at
// once, so that gradient is made directly in the weight's dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "mmsp/model/hooks/row_sharded_weight.h"

namespace mmsp::train {

// Tokens per chunk such that one chunk's fp32 logits take at most 256 MiB:
// floor(256 MiB / (4·V)), at least 1.
int64_t default_loss_chunk(int64_t vocab_size);

// Per token, differentiable (RL objectives, train/objective/): [T] in the wide dtype (fp64
// for fp64, else fp32), log p(label | prefix) under softmax(hidden·weightᵀ / temperature),
// 0 where the label is -100 (no gradient there). The same blocks and arithmetic as the
// loss below, which is −Σ of these / label_count; the backward makes each block's logits
// again and weighs each token's softmax − onehot by minus its incoming gradient, so a loss
// written on these values backpropagates to the hidden state and the head without [T, V].
at::Tensor chunked_label_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                  double temperature, int64_t chunk);
// The same with the head row-sharded (--shard parameters), read in rounds of `block` rows
// as the loss reads it. Collective: every rank calls it (forward and backward) alike.
at::Tensor chunked_label_logprobs(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                                  double temperature, int64_t block);

// [2, T], differentiable in both rows: the label log-probabilities above and the entropy of
// the same distribution at every token (an RL objective's entropy bonus). The backward
// adds the entropy's gradient, −p_j·(z_j − Σ p·z) per logit, in the same blocks.
at::Tensor chunked_label_values(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                double temperature, int64_t chunk);
at::Tensor chunked_label_values(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                                double temperature, int64_t block);

// Sum over this rank's tokens of -log softmax(hidden·weightᵀ)[label], divided by the
// global label count (summed over ranks it is the mean over the batch). Labels -100
// take no loss. hidden [T, h] and weight [V, h] in the compute dtype (weight is the
// embedding when tied: its gradient adds to the embedding's); logits are upcast to fp32
// (fp64 for fp64) for the log-sum-exp and softmax; the hidden state's gradient is summed
// over vocabulary blocks in that width (bf16 runs multiply the softmax's gradient in
// bf16, as they make the logits). Returns a 0-dim tensor in that width.
at::Tensor chunked_lm_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                           int64_t label_count, int64_t chunk);

// The same loss with the head row-sharded over the ranks (ZeRO-3, model/hooks/row_sharded_weight.h):
// its rows come in rounds of `block` rows from every rank, the next round's gather in
// flight while this one computes, forward and again in the backward, whose round
// gradients go back to their owners at once; the weight and its gradient are never
// whole on any rank. Collective: every rank calls it, with the same `block`. The value
// and the hidden state's gradient equal chunked_lm_loss's (the blocks differ: rounding).
at::Tensor chunked_lm_loss(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                           int64_t label_count, int64_t block);

// Per token, without gradients (`mmsp logprobs`): [2, T] in the wide dtype (fp64 for
// fp64, else fp32), row 0 log p(label | prefix) under softmax(hidden·weightᵀ / temperature)
// (0 where the label is -100), row 1 the entropy of that distribution. The same blocks of
// vocabulary rows as chunked_lm_loss (`chunk` tokens' worth of logits at a time), folded as
// a running maximum, Σ exp(z − max) and Σ exp(z − max)·z, so [T, V] is never whole:
// entropy = lse − Σ p·z.
at::Tensor chunked_token_values(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                double temperature, int64_t chunk);
// The same with the head row-sharded (--shard parameters): read in rounds of `block` rows
// from every rank, as the loss reads it. Collective: every rank calls it with the same block.
at::Tensor chunked_token_values(const at::Tensor& hidden, model::RowShardedWeight& head, const at::Tensor& labels,
                                double temperature, int64_t block);

// Rows a rank gives each round: so that a round's logits over `tokens_per_rank` tokens
// hold at most as many as `chunk` tokens of the whole vocabulary (chunked_lm_loss's
// blocks), and a round's rows from every rank (`row_bytes` each) and their logits'
// transients (`logit_bytes` per logit: the compute dtype's copy, the fp32 one, exp and
// gradient) take at most kRowRoundBytes together: with few tokens a chunk would be the
// whole vocabulary, and the loss, not the model, would set the step's peak. The same on
// every rank (from the options, not this rank's tokens).
constexpr int64_t kRowRoundBytes = int64_t{128} << 20;
int64_t row_sharded_block(int64_t chunk, int64_t tokens_per_rank, int64_t vocab, int ranks, int64_t row_bytes,
                          int64_t logit_bytes);

}  // namespace mmsp::train
