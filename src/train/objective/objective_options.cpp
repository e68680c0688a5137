// The objective's names, defaults and rules; see mmsp/train/objective/objective_options.h.
#include "mmsp/train/objective/objective_options.h"

#include <cmath>

#include "mmsp/core/check.h"

namespace mmsp::train {

ObjectiveOptions objective_defaults(Objective kind) {
  ObjectiveOptions o;
  o.kind = kind;
  o.agg = kind == Objective::grpo ? LossAgg::seq_mean_token_mean : LossAgg::token_mean;
  o.clip_c = kind == Objective::ppo ? 3.0 : 0.0;  // verl's clip_ratio_c
  return o;
}

Objective parse_objective(const std::string& text) {
  if (text == "cross-entropy") return Objective::cross_entropy;
  if (text == "grpo") return Objective::grpo;
  if (text == "ppo") return Objective::ppo;
  if (text == "dpo") return Objective::dpo;
  MMSP_FAIL("--objective \"", text, "\" is not one of cross-entropy, grpo, ppo, dpo");
}

LossAgg parse_loss_agg(const std::string& text) {
  if (text == "token-mean") return LossAgg::token_mean;
  if (text == "seq-mean-token-mean") return LossAgg::seq_mean_token_mean;
  if (text == "seq-mean-token-sum") return LossAgg::seq_mean_token_sum;
  if (text == "seq-mean-token-sum-norm") return LossAgg::seq_mean_token_sum_norm;
  MMSP_FAIL("--loss-agg \"", text,
            "\" is not one of token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm");
}

KlKind parse_kl_kind(const std::string& text) {
  if (text == "k1") return KlKind::k1;
  if (text == "k2") return KlKind::k2;
  if (text == "k3" || text == "low_var_kl") return KlKind::k3;
  MMSP_FAIL("--kl \"", text, "\" is not one of k1, k2, k3 (low_var_kl)");
}

const char* to_string(Objective kind) {
  switch (kind) {
    case Objective::grpo:
      return "grpo";
    case Objective::ppo:
      return "ppo";
    default:
      return "cross-entropy";
  }
}

const char* to_string(LossAgg agg) {
  switch (agg) {
    case LossAgg::seq_mean_token_mean:
      return "seq-mean-token-mean";
    case LossAgg::seq_mean_token_sum:
      return "seq-mean-token-sum";
    case LossAgg::seq_mean_token_sum_norm:
      return "seq-mean-token-sum-norm";
    default:
      return "token-mean";
  }
}

const char* to_string(KlKind kind) {
  switch (kind) {
    case KlKind::k1:
      return "k1";
    case KlKind::k2:
      return "k2";
    default:
      return "k3";
  }
}

void check_objective_options(const ObjectiveOptions& o) {
  MMSP_CHECK(o.kind != Objective::cross_entropy || (o.old_logprobs_file.empty() && o.ref_logprobs_file.empty()),
             "--old-logprobs and --ref-logprobs are read by an RL --objective (grpo, ppo, dpo), not cross-entropy");
  MMSP_CHECK(o.kind != Objective::dpo || o.old_logprobs_file.empty(),
             "--old-logprobs is GRPO's and PPO's; --objective dpo reads --ref-logprobs (its sides' sums)");
  if (o.kind == Objective::cross_entropy) return;
  MMSP_CHECK(std::isfinite(o.temperature) && o.temperature > 0, "--temperature ", o.temperature,
             " must be a finite number > 0 (the logits are divided by it)");
  if (o.kind == Objective::dpo) {
    MMSP_CHECK(std::isfinite(o.beta) && o.beta > 0, "--beta ", o.beta, " must be a finite number > 0");
    MMSP_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 0.5, "--label-smoothing ", o.label_smoothing,
               " must be in [0, 0.5) (the chance a pair's preference is flipped)");
    return;
  }
  MMSP_CHECK(std::isfinite(o.clip_low) && o.clip_low >= 0 && o.clip_low < 1, "--clip-ratio-low ", o.clip_low,
             " must be in [0, 1) (the ratio's lower bound is 1 − it)");
  MMSP_CHECK(std::isfinite(o.clip_high) && o.clip_high >= 0, "--clip-ratio-high ", o.clip_high,
             " must be a finite number ≥ 0 (the ratio's upper bound is 1 + it)");
  MMSP_CHECK(o.clip_c == 0 || (std::isfinite(o.clip_c) && o.clip_c > 1), "--clip-ratio-c ", o.clip_c,
             " must be above 1 (the dual clip's bound on −A·ratio for A < 0), or 0 for none");
  MMSP_CHECK(std::isfinite(o.kl_coef) && o.kl_coef >= 0, "--kl-coef ", o.kl_coef, " must be a finite number ≥ 0");
  MMSP_CHECK(std::isfinite(o.entropy_coef) && o.entropy_coef >= 0, "--entropy-coef ", o.entropy_coef,
             " must be a finite number ≥ 0 (the entropy bonus's weight)");
  const bool norm = o.agg == LossAgg::seq_mean_token_sum_norm;
  MMSP_CHECK(!norm || (std::isfinite(o.loss_scale) && o.loss_scale > 0), "--loss-agg seq-mean-token-sum-norm needs ",
             "--loss-scale N > 0 (the constant the sequences' sums are divided by: Dr. GRPO's, e.g. the longest ",
             "response's tokens), not ", o.loss_scale);
  MMSP_CHECK(norm || o.loss_scale == 0, "--loss-scale ", o.loss_scale,
             " is read only by --loss-agg seq-mean-token-sum-norm, not ", to_string(o.agg));
}

}  // namespace mmsp::train
