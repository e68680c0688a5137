// A step's pixels and the next step's on a thread; see pixel_prefetch.h.
#include "pixel_prefetch.h"

#include "mmsp/train/data/step_pixels.h"

namespace mmsp::train {

bool prefetches_pixels(const TrainOptions& o) {
  return o.memory.prefetch_pixels == PrefetchPixels::on ||
         (o.memory.prefetch_pixels == PrefetchPixels::automatic && o.parallel.device.is_cuda());
}

PixelPrefetch::PixelPrefetch(const TrainOptions& o, const RunInputs& in, plan::PlanOptions plan_options, int rank,
                             bool enabled)
    : o_(o), in_(in), plan_options_(std::move(plan_options)), rank_(rank), enabled_(enabled) {}

PixelPrefetch::~PixelPrefetch() {
  if (ahead_ && ahead_->pixels.valid()) ahead_->pixels.wait();
}

std::optional<NextStep> PixelPrefetch::plan_next(int64_t step, int64_t last_step, const DataPosition& position) const {
  if (!enabled_ || step >= last_step) return std::nullopt;
  DataPosition next = position;
  NextStep n;
  n.samples = in_.packer->next_step(next);
  n.batch = make_batch(*in_.data, n.samples);
  n.plan = plan::make_step_plan(n.batch, in_.resolved.config.conventions, plan_options_, rank_);
  return n;
}

void PixelPrefetch::start(NextStep next) {
  Ahead ahead;
  ahead.samples = next.samples;
  // The run's inputs outlive the thread (this object, which waits for it, goes first).
  const RunInputs* in = &in_;
  const PixelsNeeded needed = pixels_encoded_here(next.plan, o_.parallel.vision);
  const at::ScalarType dtype = o_.inputs.dtype;
  ahead.pixels = std::async(std::launch::async, [in, needed, dtype, next = std::move(next)] {
    return load_pixels(*in->data, next.samples, next.batch, in->resolved.config, needed, dtype);
  });
  ahead_ = std::move(ahead);
}

model::PixelInputs PixelPrefetch::take(const std::vector<int64_t>& samples, const plan::Batch& batch,
                                       const plan::StepPlan& plan) {
  if (ahead_) {
    Ahead ahead = std::move(*ahead_);
    ahead_.reset();
    // This step's: a decode error surfaces here, in its own step. Another step's (a test
    // hook changed this rank's samples): waited for and dropped, its errors with it.
    if (ahead.samples == samples) return ahead.pixels.get();
    ahead.pixels.wait();
  }
  return load_pixels(*in_.data, samples, batch, in_.resolved.config, pixels_encoded_here(plan, o_.parallel.vision),
                     o_.inputs.dtype);
}

}  // namespace mmsp::train
