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
#include "mmsp/model/qwen_vl.h"
#include "mmsp/plan/sequence.h"
#include "mmsp/train/dataset.h"

namespace mmsp::train {

// `needed(kind, item)`: whether this rank encodes item `item` (index among the batch's
// images, resp. videos, in batch order: plan::VisionItem::batch_index).
using PixelsNeeded = std::function<bool(plan::VisionKind kind, int64_t item)>;

// Qwen families: images [Σ image patches, C·tp·p·p], videos [Σ video patches, C·tp·p·p]
// (rows in batch order, as plan::VisionItem::patch_offset counts them; 0 rows when none).
// LLaVA: images [N_images, C, S, S], videos undefined.
// InternVL: images [Σ tiles, C, S, S] (an image's grid is [tiles, S/p, S/p]), videos undefined.
// `batch` must be make_batch(dataset, samples); every filled item's pixels are checked
// against its grid. dtype: the returned tensors' dtype (pixels are built in float32).
model::PixelInputs load_pixels(const Dataset& dataset, const std::vector<int64_t>& samples,
                               const plan::Batch& batch, const model::ModelConfig& config,
                               const PixelsNeeded& needed, at::ScalarType dtype);

}  // namespace mmsp::train
