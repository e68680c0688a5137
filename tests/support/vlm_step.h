// One step of a whole VLM under sequence parallelism, as the family tests run it
// (tests/model/families/): the model built with the same seed on every rank, the
// step's forward through parallel::forward_step, the causal LM loss, backward, and the
// loss and every parameter gradient summed over the world (sp_compare.h compares them).
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "mmsp/dist/group.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/family.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/parallel/step_parallelism.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "sp_compare.h"

namespace mmsp::test {

// Adaptive placement (docs/plan.md) with balance targets loose enough that the tests'
// small batches keep segments whole: every segment whole on most meshes, and a mix of
// whole and split ones. (The default 1 % padding splits nearly everything here, which
// is zigzag.)
inline const plan::PlacementOptions kAdaptiveBalances[] = {{1.0, 100.0}, {0.25, 1.3}};

inline plan::PlanOptions adaptive_options(const dist::Mesh& mesh, const plan::PlacementOptions& balance) {
  plan::PlanOptions options;
  options.mesh = mesh.shape();
  options.placement = plan::Placement::adaptive;
  options.placement_balance = balance;
  return options;
}

// Whole and split segments of a plan's rows, for the tests to check that they tested both.
inline std::pair<int, int> whole_and_split(const plan::StepPlan& plan) {
  std::pair<int, int> n{0, 0};
  for (const plan::RowPlan& row : plan.rows)
    for (const plan::Segment& s : row.packing.segments) ++(s.home >= 0 ? n.first : n.second);
  return n;
}

// One step of the model on this rank with the same seeds everywhere; loss and every
// parameter gradient summed over `world`.
inline StepResult run_model(const model::ModelConfig& config, const plan::Batch& batch, const plan::StepPlan& plan,
                            const parallel::StepGroups& groups, const dist::GroupPtr& world, model::VisionMode mode,
                            const model::PixelInputs& pixels, at::ScalarType dtype) {
  at::manual_seed(42);
  auto vlm = model::build_vlm(config);
  vlm->to(dtype);
  attention::AttentionOptions attn;
  attn.block_q = 8;
  attn.block_k = 8;
  auto out = parallel::forward_step(*vlm, batch, plan, pixels, groups, mode, attn);
  at::Tensor loss = train::causal_lm_loss(out.logits(), out.labels, out.label_count);
  loss.backward();
  return summed_over(*vlm, loss, world);
}

}  // namespace mmsp::test
