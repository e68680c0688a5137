// DPO's loss over the mesh; see dpo_loss.h.
#include "dpo_loss.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/plan/labels.h"

namespace mmsp::train {

ObjectiveLoss dpo_loss(const at::Tensor& logprobs, const Dataset& data, const std::vector<int64_t>& samples,
                       const plan::Batch& batch, const plan::StepPlan& plan, int64_t step_pairs,
                       const ObjectiveOptions& o, const dist::Mesh& mesh) {
  const plan::RankPlan& mine = plan.mine;
  const plan::RowPlan& row = plan.rows[static_cast<size_t>(mine.coords.dp)];
  const auto B = static_cast<int64_t>(batch.sequences.size());
  MMSP_CHECK(B % 2 == 0 && step_pairs > 0, "DPO: a micro-batch of ", B, " sequences is not whole pairs");
  // Each slot's sequence (unlabelled slots hold log p = 0: any sequence).
  std::vector<int64_t> sequence_of(static_cast<size_t>(mine.local_length), 0);
  for (int64_t l = 0; l < mine.local_length; ++l)
    if (mine.labels[static_cast<size_t>(l)] != plan::kIgnoreIndex)
      sequence_of[static_cast<size_t>(l)] =
          row.packing.segments[static_cast<size_t>(mine.segment_ids[static_cast<size_t>(l)])].sequence;
  const at::Tensor index = at::tensor(sequence_of, at::TensorOptions().dtype(at::kLong)).to(logprobs.device());
  const at::Tensor mine_sums = at::zeros({B}, logprobs.options()).index_add(0, index, logprobs);
  at::Tensor sums = mine_sums.detach().clone();
  dist::all_reduce_(sums, *mesh.world());  // every side's Σ log p, on every rank

  std::vector<double> ref(static_cast<size_t>(B));
  for (int64_t s = 0; s < B; ++s) {
    const RolloutValues* v = data.rollout(samples[static_cast<size_t>(s)]);
    MMSP_CHECK(v && v->preference.pair >= 0 && v->preference.chosen == (s % 2 == 0) && v->preference.ref_logps,
               "DPO: sequence ", s, " of the micro-batch (sample ", samples[static_cast<size_t>(s)],
               ") is not the expected side of a pair with its reference (checked before the run: a bug)");
    ref[static_cast<size_t>(s)] = *v->preference.ref_logps;
  }
  const at::Tensor margin = sums - at::tensor(ref, at::TensorOptions().dtype(at::kDouble)).to(sums.options());
  const at::Tensor h = o.beta * (margin.slice(0, 0, B, 2) - margin.slice(0, 1, B, 2));  // [pairs]
  const double eps = o.label_smoothing, pairs = static_cast<double>(step_pairs);
  const at::Tensor f = (-(1 - eps) * at::log_sigmoid(h) - eps * at::log_sigmoid(-h)).sum() / pairs;
  const at::Tensor df_dh = (-(1 - eps) * at::sigmoid(-h) + eps * at::sigmoid(h)) / pairs;
  const at::Tensor g = at::stack({o.beta * df_dh, -o.beta * df_dh}, 1).reshape({B});  // ∂f/∂π per sequence
  const double W = mesh.world_size();
  ObjectiveLoss out;
  out.loss = f / W + (g * (mine_sums - sums / W)).sum();
  // TRL's figures: every rank holds them whole, so each gives 1/W of them
  const at::Tensor chosen = o.beta * margin.slice(0, 0, B, 2), rejected = o.beta * margin.slice(0, 1, B, 2);
  const double share = 1.0 / (pairs * W);
  out.parts["rewards/chosen"] = chosen.sum().item<double>() * share;
  out.parts["rewards/rejected"] = rejected.sum().item<double>() * share;
  out.parts["rewards/accuracies"] = (chosen > rejected).sum().item<double>() * share;
  out.parts["rewards/margins"] = (chosen - rejected).sum().item<double>() * share;
  return out;
}

}  // namespace mmsp::train
