// Qwen2.5-VL's window order of merged patches; see window_index.h.
#include "mmsp/model/families/qwen_vl/window_index.h"

#include <algorithm>

#include "mmsp/core/check.h"

namespace mmsp::model {

std::vector<int64_t> WindowIndex::inverse() const {
  std::vector<int64_t> out(order.size());
  for (size_t k = 0; k < order.size(); ++k) out[order[k]] = static_cast<int64_t>(k);
  return out;
}

WindowIndex window_index(const std::vector<plan::Grid>& grids, int64_t merge, int64_t side) {
  MMSP_CHECK(side >= 1, "window of ", side, " merged patches per side: it must hold at least one");
  WindowIndex out;
  int64_t base = 0;  // first unit of the current item
  for (const plan::Grid& g : grids) {
    MMSP_CHECK(g[1] % merge == 0 && g[2] % merge == 0, "grid [", g[0], ", ", g[1], ", ", g[2],
               "] must divide by spatial_merge_size ", merge);
    const int64_t h = g[1] / merge, w = g[2] / merge;
    for (int64_t t = 0; t < g[0]; ++t)
      for (int64_t r0 = 0; r0 < h; r0 += side)
        for (int64_t c0 = 0; c0 < w; c0 += side) {
          const int64_t r1 = std::min(h, r0 + side), c1 = std::min(w, c0 + side);
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) out.order.push_back(base + (t * h + r) * w + c);
          out.window_units.push_back((r1 - r0) * (c1 - c0));
        }
    base += g[0] * h * w;
  }
  return out;
}

}  // namespace mmsp::model
