// A step's pixels, and the next step's decoded on a thread of their own while this step
// trains (--prefetch-pixels): that step's samples, batch and plan come from the data and
// the plan options alone (no collective), so its pixels are those it would load itself.
// A step takes them only if its samples are those (a test hook may change a rank's).
// Private to train/.
#pragma once

#include <future>
#include <optional>
#include <vector>

#include "mmsp/model/vlm.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/data/step_packer.h"
#include "run_inputs.h"

namespace mmsp::train {

// The step after this one, planned ahead for its pixels.
struct NextStep {
  std::vector<int64_t> samples;
  plan::Batch batch;
  plan::StepPlan plan;
};

// --prefetch-pixels resolved: auto is on with a CUDA device.
bool prefetches_pixels(const TrainOptions& o);

class PixelPrefetch {
 public:
  // `enabled`: prefetches_pixels(o); off, every step loads its own pixels.
  PixelPrefetch(const TrainOptions& o, const RunInputs& in, plan::PlanOptions plan_options, int rank, bool enabled);
  ~PixelPrefetch();  // waits for a decode still running (its inputs are the run's)
  PixelPrefetch(const PixelPrefetch&) = delete;
  PixelPrefetch& operator=(const PixelPrefetch&) = delete;

  // The step after `step` (whose data starts at `position`), planned, when its pixels are to
  // be decoded during this one: not past `last_step`, and only when enabled.
  std::optional<NextStep> plan_next(int64_t step, int64_t last_step, const DataPosition& position) const;
  // Starts decoding `next`'s pixels on a thread of its own.
  void start(NextStep next);
  // This step's pixels: the prefetched ones when they are this step's, else loaded now. A
  // decode error of this step's surfaces here, in its own step.
  model::PixelInputs take(const std::vector<int64_t>& samples, const plan::Batch& batch, const plan::StepPlan& plan);

 private:
  struct Ahead {
    std::vector<int64_t> samples;
    std::future<model::PixelInputs> pixels;
  };
  const TrainOptions& o_;
  const RunInputs& in_;
  plan::PlanOptions plan_options_;
  int rank_;
  bool enabled_;
  std::optional<Ahead> ahead_;
};

}  // namespace mmsp::train
