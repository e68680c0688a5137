// Evaluation on a held-out set (--eval-data FILE, --eval-every N): the mean cross-entropy
// over every label token of the whole file, on the mesh (the run's planner, budget and
// rows; no gradients), after every N optimizer steps and after the last. The file is
// opened and checked with the run's inputs, on every rank before the first collective;
// its steps' label tokens are counted first (plans are pure), so that every step's loss is
// divided by the file's count and their sum is the file's mean. Private to train/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mmsp/dist/mesh.h"
#include "mmsp/model/vlm.h"
#include "mmsp/parallel/parallelize.h"
#include "mmsp/train/data/dataset.h"
#include "mmsp/train/data/step_packer.h"
#include "mmsp/train/metrics.h"
#include "mmsp/train/train_options.h"
#include "mmsp/train/weight_update.h"

namespace mmsp::train {

struct RunInputs;

// The held-out file and its steps: the run's budget and rows, in file order, one pass.
struct EvalSet {
  std::unique_ptr<Dataset> data;
  std::unique_ptr<StepPacker> packer;
};

// The packer's steps over one pass of its file, in order: each sample once (a step that
// would run into a second pass stops at the file's end). With shuffle off: file order.
std::vector<std::vector<int64_t>> one_pass_steps(const StepPacker& packer);

// One step of a forward-only pass over a file (the evaluation, `mmsp logprobs`): the
// samples' batch, this rank's plan and the forward on the mesh, its pixels loaded.
struct ForwardStep {
  plan::Batch batch;
  plan::StepPlan plan;
  model::StepOutput out;
};
ForwardStep forward_samples(const Dataset& data, const std::vector<int64_t>& samples, const TrainOptions& o,
                            const RunInputs& in, const model::Vlm& vlm, const parallel::ModelParallelism& parallelism,
                            const plan::PlanOptions& plan_options, const dist::Mesh& mesh);

// Checks o.eval and opens its file for `config` (every line checked as --data's are:
// token ids within the vocabulary, images, lengths against a row); none without --eval-data.
EvalSet open_eval_set(const TrainOptions& o, const model::ModelConfig& config, int64_t tokens_per_row, int rows);

// Whether an evaluation follows step `step` of a run that ends at `last_step`.
bool evaluates_after(const EvalOptions& eval, int64_t step, int64_t last_step);

// The held-out loss of the model as it is now. Every rank calls (collectives: the
// forward's, the loss's sum); `update.begin_step()` first (--shard parameters gathers the
// weights a forward keeps whole).
EvalMetrics evaluate(int64_t step, const TrainOptions& o, const RunInputs& in, const model::Vlm& vlm,
                     const parallel::ModelParallelism& parallelism, WeightUpdate& update,
                     const plan::PlanOptions& plan_options, const dist::Mesh& mesh);

}  // namespace mmsp::train
