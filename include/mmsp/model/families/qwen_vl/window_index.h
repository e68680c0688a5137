// Qwen2.5-VL's attention windows over merged patches (transformers' get_window_index):
// each frame's grid of merged units (h/m × w/m) is cut into windows of
// window_size / (patch_size · spatial_merge_size) units per side, from the top-left,
// the last row and column of windows cut short; the units are put in window order
// (frame, window row, window column, then row-major inside the window). Windowed blocks
// attend inside each window, full blocks inside each frame, over that order; the
// merger's rows are put back in the processor's order by the inverse permutation.
// Pure index arithmetic: no tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "mmsp/plan/sequence.h"

namespace mmsp::model {

struct WindowIndex {
  // order[k]: the merged unit (index over the items' units in processor order) at
  // position k of the window order; a permutation.
  std::vector<int64_t> order;
  // merged units per window, in window order (no empty window); sums to order.size().
  std::vector<int64_t> window_units;
  // inverse[u]: the position of unit u in the window order (transformers' argsort).
  std::vector<int64_t> inverse() const;
};

// `window_units_per_side` = window_size / (patch_size · spatial_merge_size), >= 1;
// grids in patches, h and w multiples of `merge`.
WindowIndex window_index(const std::vector<plan::Grid>& grids, int64_t merge, int64_t window_units_per_side);

}  // namespace mmsp::model
