// The pixels of one step in the layout the models read (model::PixelInputs), holding
// only the items this rank encodes: a rank never decodes, nor allocates room for, an
// image another rank encodes. Which items a rank encodes is the plan's business
// (Vision DP); this file only asks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

#include "mmsp/model/config/config.h"
#include "mmsp/model/vision/pixel_inputs.h"
#include "mmsp/model/vision/vision_mode.h"
#include "mmsp/plan/sequence.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/data/dataset.h"

namespace mmsp::train {

// What a rank holds of one item: nothing, all of it, or (vision-tower SP) the pixels of its
// embedding rows [first, first + rows) — whole pixel rows where the family's layout maps
// them exactly (Qwen's m² patches a row, InternVL's tiles), else the whole item.
struct HeldPart {
  bool any = false, whole = true;
  int64_t first = 0, rows = 0;
};

// `needed(kind, item)`: what this rank holds of item `item` (index among the batch's
// images, resp. videos, in batch order: plan::VisionItem::batch_index).
using PixelsNeeded = std::function<HeldPart(plan::VisionKind kind, int64_t item)>;

// The items this rank's vision encoder reads in `mode`: those the plan assigns it
// (routed, gather) and its shard of each split item, or every item of its dp row whole
// (replicate).
PixelsNeeded pixels_encoded_here(const plan::StepPlan& plan, model::VisionMode mode);

// Only the needed items, in batch order, in the family's layout (model::PixelGeometry:
// each item's batch_rows along dim 0): Qwen-VL images [Σ needed image patches, C·tp·p·p],
// videos likewise (0 rows when none); LLaVA images [needed images, C, S, S], videos
// undefined (the family takes none). image_offsets / video_offsets say where each item
// of the batch starts (−1: not needed). `batch` must be make_batch(dataset, samples);
// every loaded item's pixels are checked against its grid. dtype: the returned tensors'
// dtype (datasets build pixels in float32).
model::PixelInputs load_pixels(const Dataset& dataset, const std::vector<int64_t>& samples, const plan::Batch& batch,
                               const model::ModelConfig& config, const PixelsNeeded& needed, at::ScalarType dtype);

}  // namespace mmsp::train
