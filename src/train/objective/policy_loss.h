// GRPO's and PPO's loss on this rank's slots (--objective grpo|ppo; docs/rl.md): each
// labelled token's clipped surrogate −A·r (r = p / p_old), plus kl_coef × its KL estimate
// to the reference, weighed by its sequence's share of the step's aggregate. Every mode
// of verl's loss_agg_mode is a weighted sum of per-token terms whose weights need only the
// step's label counts, which every rank knows (the step's batches are the same on every
// rank): so each rank sums its own tokens' terms and the sum over ranks, which the
// gradients' reduction makes, is one process's loss; no per-token values are exchanged.
// Private to train/.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/plan/step_plan.h"
#include "mmsp/train/data/dataset.h"
#include "mmsp/train/objective/objective_options.h"
#include "objective_loss.h"

namespace mmsp::train {

// Each sequence's weight per labelled token, by micro-batch (the step's K micro-batches
// aggregate as one batch): token-mean 1 / (labelled tokens of the step), seq-mean-token-mean
// 1 / (B'·n_b), seq-mean-token-sum 1 / B', seq-mean-token-sum-norm 1 / loss_scale (B': the
// step's sequences with a labelled token; n_b: sequence b's labelled tokens).
std::vector<std::vector<double>> sequence_weights(const std::vector<const plan::Batch*>& micro_batches,
                                                  const plan::ModelConventions& conventions, LossAgg agg,
                                                  double loss_scale);

// This rank's slots' rollout numbers ([L] double on `device`, 0 on unlabelled slots and
// padding): advantages, weights, and the old and reference log-probabilities (undefined
// when no sample of the batch gives them; a sample without old_logprobs takes the current
// policy's, detached: `on_policy` 1 there).
struct RankRollout {
  at::Tensor advantages, weights, old_logprobs, on_policy, ref_logprobs;
};
RankRollout rank_rollout(const Dataset& data, const std::vector<int64_t>& samples, const plan::Batch& batch,
                         const plan::StepPlan& plan, const std::vector<double>& weights,
                         const plan::ModelConventions& conventions, const at::Device& device);

// The rank's part of the step's loss (0-dim, differentiable through `logprobs`, this
// rank's [L] label log-probabilities at the objective's temperature), and its shares of
// "pg_loss", "kl" (the aggregated terms) and "pg_clipfrac" (the share of the step's
// `step_labels` labelled tokens whose clip was active).
// `entropy`: [L] the policy's entropy at the slots (differentiable), read when
// o.entropy_coef is not 0 (then also its share "entropy").
ObjectiveLoss policy_loss(const at::Tensor& logprobs, const at::Tensor& entropy, const RankRollout& rollout,
                          const ObjectiveOptions& o, int64_t step_labels);

// Before any collective, on every rank alike, naming the sample's line: GRPO / PPO: every
// sample with labelled tokens has its advantages, and its ref_logprobs when kl_coef is not
// 0; DPO: every line is a pair whose sides have labelled tokens and a reference sum; the
// other objectives refuse a file of pairs.
void check_rollouts(const Dataset& data, const plan::ModelConventions& conventions, const ObjectiveOptions& o,
                    const std::string& data_path);

}  // namespace mmsp::train
