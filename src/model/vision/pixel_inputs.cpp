// Where an item's pixel rows start; see pixel_inputs.h.
#include "mmsp/model/vision/pixel_inputs.h"

#include "mmsp/core/check.h"

namespace mmsp::model {

int64_t PixelInputs::first_row(const plan::VisionItem& item, int64_t whole_batch_row) const {
  const std::vector<int64_t>& offsets = item.kind == plan::VisionKind::image ? image_offsets : video_offsets;
  if (offsets.empty()) return whole_batch_row;
  const int64_t row = item.batch_index < static_cast<int64_t>(offsets.size()) ? offsets[item.batch_index] : -1;
  MMSP_CHECK(row >= 0, "pixels of ", plan::to_string(item.kind), " ", item.batch_index,
             " are not held on this rank (its pixels hold the items it encodes)");
  return row;
}

int64_t PixelInputs::row_of(const plan::VisionItem& item, int64_t whole_batch_row, int64_t row, int64_t count) const {
  const bool image = item.kind == plan::VisionKind::image;
  const std::vector<int64_t>& from = image ? image_held_from : video_held_from;
  const std::vector<int64_t>& held = image ? image_held_rows : video_held_rows;
  const int64_t first = first_row(item, whole_batch_row);
  if (from.empty()) return first + row;
  const int64_t lo = from.at(item.batch_index), n = held.at(item.batch_index);
  MMSP_CHECK(row >= lo && row + count <= lo + n, "rows ", row, "..", row + count, " of ", plan::to_string(item.kind),
             " ", item.batch_index, " are not held on this rank (it holds rows ", lo, "..", lo + n, ")");
  return first + row - lo;
}

PixelInputs PixelInputs::to(const c10::Device& device) const {
  PixelInputs moved = *this;
  if (images.defined()) moved.images = images.to(device);
  if (videos.defined()) moved.videos = videos.to(device);
  return moved;
}

}  // namespace mmsp::model
