// Pixels in the family's layout (PixelGeometry, pixel_geometry.h): items in batch order
// (image_grid_thw order), each item's rows one after the other along dim 0. Qwen-VL:
// rows of flattened patches [Σ patches, C·tp·p·p]; LLaVA: whole images [N, C, S, S];
// InternVL: tiles [Σ tiles, C, S, S].
// Either the whole batch (the offset lists empty: an item starts at the row the caller
// computes from the batch) or only some items, as a rank under Vision DP holds the items
// it encodes (train::load_pixels): then image_offsets[batch_index] is where the image's
// rows start, -1 for an image not held here; videos likewise.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "mmsp/plan/vision_routes.h"

namespace mmsp::model {

struct PixelInputs {
  at::Tensor images;
  at::Tensor videos;  // undefined where the family takes no video or the batch has none
  std::vector<int64_t> image_offsets, video_offsets;
  // Vision-tower SP: a rank holds only its shard of a split item's rows. held_from[i] is
  // the item's first row held, held_rows[i] how many (empty lists: every held item whole).
  std::vector<int64_t> image_held_from, image_held_rows, video_held_from, video_held_rows;

  // First row of `item` in images / videos; `whole_batch_row` is where it starts when the
  // whole batch is held. Throws when the item is not held here.
  int64_t first_row(const plan::VisionItem& item, int64_t whole_batch_row) const;
  // Where rows [row, row + count) of `item` (counted within the item) start; throws
  // unless they are held here.
  int64_t row_of(const plan::VisionItem& item, int64_t whole_batch_row, int64_t row, int64_t count) const;
  // The same pixels on `device` (read from the files on the host, encoded there).
  PixelInputs to(const c10::Device& device) const;
};

}  // namespace mmsp::model
