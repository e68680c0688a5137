// The vision tower's share of a step's memory. What a rank's tower holds depends on the
// step's items and who encodes them (Vision DP's whole items, --vision-split's shards), so
// it is priced per step from the plan, which every rank computes alike: a step whose
// busiest rank would not fit is refused on every rank before the step's first
// collective, naming its items (the decoder's part is the run's preflight,
// memory_estimate.h).
#pragma once

#include <ATen/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "mmsp/model/config/config.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/vision/vision_mode.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::train {

// What one rank's tower encodes in a step.
struct VisionLoad {
  int dp = 0, context_rank = 0;
  int64_t tokens = 0;         // tower tokens (patches) it encodes: its whole items' and its split shards'
  int64_t rows = 0;           // embedding rows its tower outputs
  int64_t received_rows = 0;  // rows that land in its placeholder slots (routed to it, or its own)
  int64_t largest_item = 0;   // the most patches of one item it encodes (whole) or takes part in (split)
};

// Every rank's load of the step (dp-major, context ranks within), under `mode`
// (replicate: each rank encodes every item of its row; gather: every rank receives its
// row's every row).
std::vector<VisionLoad> vision_loads(const plan::StepPlan& plan, model::VisionMode mode);

// The load's bytes in the compute dtype (model::VisionMemoryShape of the family).
struct VisionBytes {
  int64_t kept = 0;       // held from the tower's forward to its backward: pixels, blocks, rows
  int64_t transient = 0;  // the largest transient of its backward (one block's)
  int64_t total() const { return kept + transient; }
};
VisionBytes vision_bytes(const model::ModelConfig& config, const VisionLoad& load,
                         model::ActivationCheckpointing checkpointing, at::ScalarType dtype);

// The load of `loads` whose bytes are largest (the first on a tie), and those bytes.
struct BusiestVision {
  VisionLoad load;
  VisionBytes bytes;
};
BusiestVision busiest_vision(const model::ModelConfig& config, const std::vector<VisionLoad>& loads,
                             model::ActivationCheckpointing checkpointing, at::ScalarType dtype);

// --prefetch-pixels: the most bytes any rank holds while it decodes the next step's
// pixels during this one (`loads`: the next step's): its pixels in the compute dtype,
// and the decoded frames and their resized copy in 8 bits on the way (a long video's
// measured cost: docs/bench/video.md).
int64_t prefetched_pixel_bytes(const model::ModelConfig& config, const std::vector<VisionLoad>& loads,
                               at::ScalarType dtype);

}  // namespace mmsp::train
