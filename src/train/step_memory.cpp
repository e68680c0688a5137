// The per-step memory preflight; see step_memory.h.
#include "step_memory.h"

#include <sstream>

#include "mmsp/train/memory/vision_load.h"

namespace mmsp::train {
namespace {

// "step 3 (samples 4 5 …): the vision tower of dp rank 0, context rank 1 encodes …"
std::string what_is_large(const TrainOptions& o, int64_t step, const std::vector<int64_t>& samples,
                          const BusiestVision& busiest, int64_t slots) {
  std::ostringstream what;
  what << "step " << step << " (samples";
  for (size_t i = 0; i < samples.size() && i < 8; ++i) what << " " << samples[i];
  what << (samples.size() > 8 ? " …)" : ")");
  const VisionLoad& l = busiest.load;
  if (l.tokens > 0)
    what << ": the vision tower of dp rank " << l.dp << ", context rank " << l.context_rank << " encodes " << l.tokens
         << " patches (its largest item " << l.largest_item << " patches; vision " << format_bytes(busiest.bytes.kept)
         << " kept + " << format_bytes(busiest.bytes.transient) << " in its backward, --vision-split "
         << plan::to_string(o.parallel.vision_split) << ")";
  if (slots > o.inputs.tokens_per_rank)
    what << (l.tokens > 0 ? "; " : ": ") << "a rank holds " << slots
         << " slots, padding included, for --tokens-per-rank " << o.inputs.tokens_per_rank;
  return what.str();
}

}  // namespace

void check_step_memory(const TrainOptions& o, const RunInputs& in, const plan::Mesh& mesh, int64_t step,
                       const std::vector<int64_t>& samples, const plan::StepPlan& plan, MemoryEstimate& largest,
                       std::optional<NextStep>& next) {
  const model::ModelConfig& config = in.resolved.config;
  const BusiestVision busiest =
      busiest_vision(config, vision_loads(plan, o.parallel.vision), o.memory.checkpoint_activations, o.inputs.dtype);
  // The decoder's part again when padding gives a rank more slots than --tokens-per-rank.
  int64_t slots = 0;
  for (const plan::RowPlan& row : plan.rows) slots = std::max(slots, row.shards.local_length());
  MemoryEstimate estimate =
      slots > o.inputs.tokens_per_rank ? estimate_for(config, in.layout, o, in.loss_chunk, mesh, slots) : in.memory;
  estimate.vision = busiest.bytes.kept;
  estimate.vision_working_set = busiest.bytes.transient;
  const int64_t limit = o.memory.limit_bytes;
  if (next && !o.parallel.device.is_cuda()) {  // on CUDA they wait in host memory, not on the device
    estimate.next_pixels = prefetched_pixel_bytes(config, vision_loads(next->plan, o.parallel.vision), o.inputs.dtype);
    if (limit > 0 && estimate.total() > limit) {
      next.reset();
      estimate.next_pixels = 0;
    }
  }
  if (estimate.total() > largest.total()) largest = estimate;
  if (limit <= 0 || estimate.total() <= limit) return;
  check_memory_fits(estimate, limit, o.memory.limit_source, what_is_large(o, step, samples, busiest, slots));
}

}  // namespace mmsp::train
