// DPO's loss on preference pairs (--objective dpo; docs/rl.md): per pair, with the
// policy's and the reference's sums of log-probabilities over each side's labelled tokens,
// h = β·((π_c − ref_c) − (π_r − ref_r)) and ℓ = −(1 − ε)·log σ(h) − ε·log σ(−h) (TRL's
// "sigmoid" loss with label_smoothing ε), averaged over the step's pairs. A side's tokens
// lie on several ranks: each rank sums its slots' log-probabilities per sequence, one
// all-reduce over the world of B numbers (B: the micro-batch's sequences) gives every rank
// every sum, and each rank's loss is f/W + Σ_s ∂f/∂π_s · (π_s,mine − π_s/W): summed over
// the W ranks it is f, and its gradient is Σ_s ∂f/∂π_s · ∂π_s,mine, whose sum over ranks
// (the gradient reduction) is one process's. Private to train/.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "mmsp/dist/mesh.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/data/dataset.h"
#include "mmsp/train/objective/objective_options.h"
#include "objective_loss.h"

namespace mmsp::train {

// This rank's share of the step's DPO loss (0-dim, differentiable through `logprobs`, the
// rank's [L] label log-probabilities) for a micro-batch of whole pairs (chosen, rejected,
// chosen, ...: the packer's groups of 2); `step_pairs`: the pairs of the whole step. Its
// shares of TRL's figures: "rewards/chosen" and "rewards/rejected" (the mean of β·(π − ref)),
// "rewards/accuracies" (the pairs whose chosen reward is larger), "rewards/margins".
// Collective: one all-reduce over the world.
ObjectiveLoss dpo_loss(const at::Tensor& logprobs, const Dataset& data, const std::vector<int64_t>& samples,
                       const plan::Batch& batch, const plan::StepPlan& plan, int64_t step_pairs,
                       const ObjectiveOptions& o, const dist::Mesh& mesh);

}  // namespace mmsp::train
