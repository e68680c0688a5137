// Where an item's pixel rows start; see pixel_inputs.h.
#include "mmsp/model/pixel_inputs.h"

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

}  // namespace mmsp::model
