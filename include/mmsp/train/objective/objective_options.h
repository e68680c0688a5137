// What a training step minimises (docs/rl.md#from-the-cli-mmsp-train---objective): the
// next-token cross-entropy, or a policy-gradient objective on per-token log-probabilities
// with the rollout numbers of each .jsonl line (data/rollout_values.h): GRPO's and PPO's
// clipped surrogate, an optional KL term to reference log-probabilities, aggregated as
// verl's loss_agg_mode says; or DPO's sigmoid loss on preference pairs' summed
// log-probabilities. Names and defaults follow verl's actor config and TRL's GRPO and DPO.
#pragma once

#include <string>

namespace mmsp::train {

enum class Objective { cross_entropy, grpo, ppo, dpo };
// verl's loss_agg_mode (mmsp.rl.agg_loss): how per-token losses become the step's number.
enum class LossAgg { token_mean, seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm };
// J. Schulman's estimators of KL(policy ‖ reference) per token (mmsp.rl.kl_penalty).
enum class KlKind { k1, k2, k3 };

struct ObjectiveOptions {
  Objective kind = Objective::cross_entropy;
  // Defaults by objective (objective_defaults): GRPO seq-mean-token-mean (the GRPO paper's,
  // TRL's "grpo"), PPO token-mean (verl's).
  LossAgg agg = LossAgg::token_mean;
  double clip_low = 0.2, clip_high = 0.2;  // the ratio's range [1 − low, 1 + high]
  double clip_c = 0;                       // verl's dual clip for negative advantages (0: off; PPO's default 3)
  double kl_coef = 0;                      // × the aggregated KL to ref_logprobs (0: no reference read)
  double entropy_coef = 0;                 // − × the aggregated entropy (verl's entropy_coeff; 0: not computed)
  KlKind kl = KlKind::k3;                  // verl's low_var_kl, TRL's GRPO KL
  double temperature = 1.0;                // the logits are divided by it, as the rollout engine sampled
  double loss_scale = 0;                   // seq-mean-token-sum-norm's constant (Dr. GRPO): required there
  double beta = 0.1;                       // DPO: the implicit reward's scale (TRL's beta)
  double label_smoothing = 0;              // DPO: cDPO's ε, the chance a pair's preference is flipped
  // `mmsp logprobs` output files over the same --data, joined to its samples by "index":
  // the old policy's log-probabilities (GRPO, PPO) and the reference's (their sums for DPO),
  // instead of (not beside) the lines' old_logprobs / ref_logprobs.
  std::string old_logprobs_file, ref_logprobs_file;
};

// The objective's defaults (its agg and dual clip) with the rest as ObjectiveOptions has them.
ObjectiveOptions objective_defaults(Objective kind);

// Text forms as the flags spell them: "cross-entropy", "grpo", "ppo", "dpo"; "token-mean", ...;
// "k1", "k2", "k3" (and verl's "low_var_kl" for k3). Unknown text is an error listing them.
Objective parse_objective(const std::string& text);
LossAgg parse_loss_agg(const std::string& text);
KlKind parse_kl_kind(const std::string& text);
const char* to_string(Objective kind);
const char* to_string(LossAgg agg);
const char* to_string(KlKind kind);

// The numbers' rules, naming the flag and the value: clip ranges in [0, 1) for low and ≥ 0
// for high, a dual clip above 1 (or 0), kl_coef ≥ 0 and finite, a finite temperature > 0,
// --loss-scale > 0 exactly when the agg is seq-mean-token-sum-norm; DPO's beta finite > 0
// and label smoothing in [0, 0.5); the log-prob files only with an RL objective (DPO: no
// --old-logprobs).
void check_objective_options(const ObjectiveOptions& o);

}  // namespace mmsp::train
