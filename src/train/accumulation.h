// Gradient accumulation (--accumulate K): a step's K micro-batches, each the batch a step
// of one micro-batch would read, all planned before the first of them runs, so that their
// label tokens together normalise every micro-step's loss: the summed gradients are one
// process's on the union of the K batches (token-weighted, as one big step), with the
// activations of one micro-batch at a time. Private to train/.
#pragma once

#include <cstdint>
#include <vector>

#include "mmsp/plan/step_plan.h"
#include "mmsp/train/data/step_packer.h"
#include "mmsp/train/metrics.h"
#include "mmsp/train/step_fingerprint.h"
#include "mmsp/train/step_watch.h"

namespace mmsp::train {

struct MicroBatch {
  std::vector<int64_t> samples;
  plan::Batch batch;
  plan::StepPlan plan;
};

struct StepBatches {
  std::vector<MicroBatch> micro;  // in the order they run
  int64_t label_count = 0;        // label tokens of all of them: each micro-step's loss divisor
  // Every micro-batch's fingerprint, its fields named "samples[k]", ...: what the ranks
  // agree on once, before the step's first collective.
  StepFingerprint fingerprint() const;
};

// The next `count` micro-batches from `position` (advanced past them), planned for `rank`.
// Pure: the same on every rank but for the watch's test hook (a skewed rank's samples).
StepBatches plan_step_batches(const Dataset& data, const StepPacker& packer, const StepWatch& watch,
                              const plan::ModelConventions& conventions, const plan::PlanOptions& options, int rank,
                              int64_t count, DataPosition& position);

// The step's tokens, attention pairs and label tokens are those of all its micro-batches
// (agreed_metrics counted the last one's).
void count_step_batches(StepMetrics& m, const StepBatches& batches);

}  // namespace mmsp::train
