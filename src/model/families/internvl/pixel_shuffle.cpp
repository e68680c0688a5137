// Pixel shuffle; see pixel_shuffle.h.
#include "mmsp/model/families/internvl/pixel_shuffle.h"

#include <ATen/ATen.h>

#include <cmath>

#include "mmsp/core/check.h"

namespace mmsp::model {

at::Tensor pixel_shuffle(const at::Tensor& features, int64_t k) {
  MMSP_CHECK(features.dim() == 3, "pixel_shuffle: features must be [N, rows, D], got ", features.sizes());
  const int64_t N = features.size(0), rows = features.size(1), D = features.size(2);
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(rows))));
  MMSP_CHECK(side * side == rows, "pixel_shuffle: ", rows, " rows per tile are not a square grid");
  MMSP_CHECK(k >= 1 && side % k == 0, "pixel_shuffle: ", side, " patches a side do not divide by ", k);
  // [N, side/k (r), k (i), side/k (c), k (j), D] -> [N, r, c, i, j, D]
  return features.reshape({N, side / k, k, side / k, k, D})
      .permute({0, 1, 3, 2, 4, 5})
      .reshape({N, (side / k) * (side / k), k * k * D});
}

}  // namespace mmsp::model
