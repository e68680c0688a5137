// GRPO's and PPO's loss on a rank's slots; see policy_loss.h.
#include "policy_loss.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/plan/labels.h"
#include "mmsp/train/data/jsonl_dataset.h"

namespace mmsp::train {
namespace {

// verl's clamp of the log-ratio (and of k3's): exact below it, finite beyond.
constexpr double kLogRatioClamp = 20.0;

// Each labelled position's order among the sequence's labelled tokens (-1 elsewhere).
std::vector<int64_t> label_ordinals(const plan::Sequence& seq, const plan::ModelConventions& conventions) {
  const auto n = static_cast<int64_t>(seq.input_ids.size());
  std::vector<int64_t> labels(static_cast<size_t>(n)), ordinal(static_cast<size_t>(n), -1);
  plan::fill_labels(seq, conventions, 0, n, labels.data());
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i)
    if (labels[static_cast<size_t>(i)] != plan::kIgnoreIndex) ordinal[static_cast<size_t>(i)] = k++;
  return ordinal;
}

// Per-token KL estimate of the policy from the reference (mmsp.rl.kl_penalty).
at::Tensor kl_penalty(const at::Tensor& lp, const at::Tensor& ref, KlKind kind) {
  if (kind == KlKind::k1) return lp - ref;
  if (kind == KlKind::k2) return 0.5 * (lp - ref).square();
  const at::Tensor kl = at::clamp(ref - lp, -kLogRatioClamp, kLogRatioClamp);
  return at::clamp(kl.exp() - kl - 1, -10.0, 10.0);
}

std::string where_is(const Dataset& data, int64_t index) {
  if (const auto* jsonl = dynamic_cast<const JsonlDataset*>(&data)) return jsonl->location(index);
  return detail::concat("sample ", index);
}

}  // namespace

std::vector<std::vector<double>> sequence_weights(const std::vector<const plan::Batch*>& micro_batches,
                                                  const plan::ModelConventions& conventions, LossAgg agg,
                                                  double loss_scale) {
  std::vector<std::vector<int64_t>> counts;
  int64_t tokens = 0, sequences = 0;
  for (const plan::Batch* batch : micro_batches) {
    counts.emplace_back();
    for (const plan::Sequence& seq : batch->sequences) {
      counts.back().push_back(plan::count_labels(seq, conventions));
      tokens += counts.back().back();
      sequences += counts.back().back() > 0 ? 1 : 0;
    }
  }
  MMSP_CHECK(tokens > 0, "the step has no labelled tokens: nothing to learn from (check loss_mask)");
  std::vector<std::vector<double>> weights;
  for (const std::vector<int64_t>& batch : counts) {
    weights.emplace_back();
    for (const int64_t n : batch) {
      double w = 0;
      if (n > 0) {
        switch (agg) {
          case LossAgg::token_mean:
            w = 1.0 / static_cast<double>(tokens);
            break;
          case LossAgg::seq_mean_token_mean:
            w = 1.0 / (static_cast<double>(sequences) * static_cast<double>(n));
            break;
          case LossAgg::seq_mean_token_sum:
            w = 1.0 / static_cast<double>(sequences);
            break;
          case LossAgg::seq_mean_token_sum_norm:
            w = 1.0 / loss_scale;
            break;
        }
      }
      weights.back().push_back(w);
    }
  }
  return weights;
}

RankRollout rank_rollout(const Dataset& data, const std::vector<int64_t>& samples, const plan::Batch& batch,
                         const plan::StepPlan& plan, const std::vector<double>& weights,
                         const plan::ModelConventions& conventions, const at::Device& device) {
  const plan::RankPlan& mine = plan.mine;
  const plan::RowPlan& row = plan.rows[static_cast<size_t>(mine.coords.dp)];
  const int64_t L = mine.local_length;
  at::Tensor adv = at::zeros({L}, at::kDouble), w = at::zeros({L}, at::kDouble), old = at::zeros({L}, at::kDouble),
             on_policy = at::ones({L}, at::kDouble), ref = at::zeros({L}, at::kDouble);
  double *a = adv.data_ptr<double>(), *wt = w.data_ptr<double>(), *o = old.data_ptr<double>(),
         *on = on_policy.data_ptr<double>(), *r = ref.data_ptr<double>();
  bool any_old = false, any_ref = false;
  std::vector<std::vector<int64_t>> ordinals(batch.sequences.size());
  for (int64_t l = 0; l < L; ++l) {
    if (mine.labels[static_cast<size_t>(l)] == plan::kIgnoreIndex) continue;
    const plan::Segment& seg = row.packing.segments[static_cast<size_t>(mine.segment_ids[static_cast<size_t>(l)])];
    const auto s = static_cast<size_t>(seg.sequence);
    if (ordinals[s].empty()) ordinals[s] = label_ordinals(batch.sequences[s], conventions);
    const int64_t k = ordinals[s][static_cast<size_t>(mine.segment_index[static_cast<size_t>(l)])];
    const RolloutValues* v = data.rollout(samples[s]);
    MMSP_CHECK(v && !v->advantages.empty() && k >= 0, where_is(data, samples[s]), ": no advantages for labelled token ",
               k, " (checked before the run: a bug)");
    a[l] = v->advantage(k);
    wt[l] = weights[s];
    if (!v->old_logprobs.empty()) {
      o[l] = v->old_logprobs[static_cast<size_t>(k)];
      on[l] = 0;
      any_old = true;
    }
    if (!v->ref_logprobs.empty()) {
      r[l] = v->ref_logprobs[static_cast<size_t>(k)];
      any_ref = true;
    }
  }
  RankRollout out;
  out.advantages = adv.to(device);
  out.weights = w.to(device);
  if (any_old) {
    out.old_logprobs = old.to(device);
    out.on_policy = on_policy.to(device);
  }
  if (any_ref) out.ref_logprobs = ref.to(device);
  return out;
}

ObjectiveLoss policy_loss(const at::Tensor& logprobs, const at::Tensor& entropy, const RankRollout& rollout,
                          const ObjectiveOptions& o, int64_t step_labels) {
  const at::ScalarType dtype = logprobs.scalar_type();
  const at::Tensor lp = logprobs, current = logprobs.detach();
  const at::Tensor old = rollout.old_logprobs.defined()
                             ? at::where(rollout.on_policy > 0, current, rollout.old_logprobs.to(dtype))
                             : current;
  const at::Tensor A = rollout.advantages.to(dtype), w = rollout.weights.to(dtype);
  // PPO's surrogate, as mmsp.rl.clipped_surrogate writes it (the same ops: the same
  // gradient where the two branches tie).
  const at::Tensor ratio = at::clamp(lp - old, -kLogRatioClamp, kLogRatioClamp).exp();
  const at::Tensor unclipped = -A * ratio, clipped = -A * at::clamp(ratio, 1 - o.clip_low, 1 + o.clip_high);
  at::Tensor per_token = at::maximum(unclipped, clipped);
  if (o.clip_c > 0) per_token = at::where(A < 0, at::minimum(per_token, -A * o.clip_c), per_token);
  ObjectiveLoss out;
  out.loss = (per_token * w).sum();
  out.parts["pg_loss"] = out.loss.detach().item<double>();
  out.parts["pg_clipfrac"] = ((clipped > unclipped) & (w > 0)).sum().item<double>() / static_cast<double>(step_labels);
  if (o.kl_coef != 0) {
    MMSP_CHECK(rollout.ref_logprobs.defined(), "--kl-coef ", o.kl_coef, " needs ref_logprobs (checked before the run)");
    const at::Tensor kl = (kl_penalty(lp, rollout.ref_logprobs.to(dtype), o.kl) * w).sum();
    out.parts["kl"] = kl.detach().item<double>();
    out.loss = out.loss + o.kl_coef * kl;
  }
  if (o.entropy_coef != 0) {
    const at::Tensor bonus = (entropy * w).sum();
    out.parts["entropy"] = bonus.detach().item<double>();
    out.loss = out.loss - o.entropy_coef * bonus;
  }
  return out;
}

void check_rollouts(const Dataset& data, const plan::ModelConventions& conventions, const ObjectiveOptions& o,
                    const std::string& data_path) {
  const bool dpo = o.kind == Objective::dpo;
  if (!dpo && data.size() > 0 && data.rollout(0) && data.rollout(0)->preference.pair >= 0)
    MMSP_FAIL(where_is(data, 0), ": the file holds preference pairs (chosen, rejected): --objective dpo trains on ",
              "them, not ", to_string(o.kind));
  if (o.kind == Objective::cross_entropy) return;
  MMSP_CHECK(dynamic_cast<const JsonlDataset*>(&data), "--objective ", to_string(o.kind), " reads each sample's ",
             dpo ? "preference pair" : "advantages", " from a .jsonl --data (docs/rl.md); --data ", data_path,
             " has none");
  if (dpo) {
    for (int64_t i = 0; i < data.size(); ++i) {
      const RolloutValues* v = data.rollout(i);
      MMSP_CHECK(v && v->preference.pair >= 0, where_is(data, i),
                 ": not a preference pair: --objective dpo reads lines {\"chosen\": {...}, \"rejected\": {...}}");
      MMSP_CHECK(plan::count_labels(data.sequence(i), conventions) > 0, where_is(data, i),
                 " has no labelled tokens (loss_mask 1 on the completion): its log-probability would be 0");
      MMSP_CHECK(v->preference.ref_logps.has_value(), where_is(data, i), ": the reference is missing: --objective ",
                 "dpo needs ", v->preference.chosen ? "ref_chosen_logps" : "ref_rejected_logps",
                 " on the line (or the side's ref_logprobs per token; mmsp logprobs --model REF writes them)");
    }
    return;
  }
  for (int64_t i = 0; i < data.size(); ++i) {
    if (plan::count_labels(data.sequence(i), conventions) == 0) continue;
    const RolloutValues* v = data.rollout(i);
    MMSP_CHECK(v && !v->advantages.empty(), where_is(data, i), ": advantages is missing: --objective ",
               to_string(o.kind), " needs every sample's advantages (one number for the sequence, or one per ",
               "labelled token)");
    MMSP_CHECK(o.kl_coef == 0 || !v->ref_logprobs.empty(), where_is(data, i), ": ref_logprobs is missing: --kl-coef ",
               o.kl_coef, " needs every sample's reference log-probabilities (mmsp logprobs --model REF writes them)");
  }
}

}  // namespace mmsp::train
