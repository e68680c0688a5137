// The tensors of one rank's step, read off the plan: token ids, positions and labels
// of its slots, and every ring share's token layout for attention (the loss of these
// labels is train/causal_lm_loss.h). The model asks
// the plan where things are; it never searches token ids itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/attention/token_layout.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::model {

struct RankInputs {
  at::Tensor token_ids;  // int64 [L]; padding slots hold token 0 (never attended, no label)
  at::Tensor positions;  // int64 [rows, L]: 3 rows for mRoPE, 1 for RoPE
  at::Tensor labels;     // int64 [L]; -100 where no loss is taken
  at::Tensor real;       // int64 [R]: the slots holding a token, not padding (MoE routing statistics)
  std::vector<attention::TokenLayout> ring_shares;  // layout of every ring rank's share
  // [context rank] its split slots when some segment is held whole (--placement adaptive):
  // only those are exchanged; empty when every segment is split (zigzag)
  std::vector<int64_t> split_slots;
  int64_t label_count = 0;       // labels of the whole batch (the loss normaliser)
  int64_t longest_sequence = 0;  // tokens of the batch's longest sequence (alike on every rank)
};

// For plan.mine (the rank the plan was made for).
RankInputs rank_inputs(const plan::Batch& batch, const plan::StepPlan& plan);

}  // namespace mmsp::model
