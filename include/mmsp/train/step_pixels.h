// The pixels of one step in the layout the models read (model::PixelInputs): the whole
// batch's tensors, allocated as zeros, with only the items this rank encodes filled in,
// so a rank never decodes an image it does not encode. Which items a rank encodes is
// the plan's business (Vision DP); this file only asks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

#include "mmsp/model/config.h"
#include "mmsp/model/vlm.h"
#include "mmsp/plan/sequence.h"
#include "mmsp/train/dataset.h"

namespace mmsp::train {

// `needed(kind, item)`: whether this rank encodes item `item` (index among the batch's
// images, resp. videos, in batch order: plan::VisionItem::batch_index).
using PixelsNeeded = std::function<bool(plan::VisionKind kind, int64_t item)>;

// images and videos in the family's layout (model::PixelGeometry: each item's
// batch_rows along dim 0, in batch order; 0 rows when none): Qwen-VL [Σ patches, C·tp·p·p]
// (as plan::VisionItem::patch_offset counts them), LLaVA [N_images, C, S, S] and videos
// undefined (the family takes none).
// `batch` must be make_batch(dataset, samples); every filled item's pixels are checked
// against its grid. dtype: the returned tensors' dtype (pixels are built in float32).
model::PixelInputs load_pixels(const Dataset& dataset, const std::vector<int64_t>& samples,
                               const plan::Batch& batch, const model::ModelConfig& config,
                               const PixelsNeeded& needed, at::ScalarType dtype);

}  // namespace mmsp::train
