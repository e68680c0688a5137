// The step's loss through the LM head, as the head is held: whole (chunks of the head and
// the cross-entropy, never [T, V] whole), or row-sharded under --shard parameters (read in
// rounds of rows, never gathered whole). Private to train/.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/model/vlm.h"

namespace mmsp::train {

// The loss of `out` (the decoder's hidden states, labels and the global label count) on
// `vlm`'s head: this rank's part of the step's mean, ready for backward.
at::Tensor head_loss(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk, int64_t tokens_per_rank);

// Per token of `out`, differentiable: [L] wide, the label's log-probability under
// softmax(logits / temperature), 0 where unlabelled (RL objectives; loss/chunked_loss.h).
at::Tensor head_label_logprobs(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                               int64_t tokens_per_rank, double temperature);

// The same with the entropy, both differentiable: [2, L] (an RL objective's entropy bonus).
at::Tensor head_label_values(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                             int64_t tokens_per_rank, double temperature);

// Per token of `out` (no gradients), through the head as it is held, in the same blocks or
// rounds as the loss: [2, L] wide, the label's log-probability under softmax(logits /
// temperature) (0 where unlabelled) and the entropy (loss/chunked_loss.h).
at::Tensor head_token_values(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                             int64_t tokens_per_rank, double temperature);

}  // namespace mmsp::train
