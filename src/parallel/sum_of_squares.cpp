// Σ x² by slices; see sum_of_squares.h.
#include "mmsp/parallel/sum_of_squares.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace mmsp::parallel {

at::Tensor sum_of_squares(const at::Tensor& x) {
  constexpr int64_t kSlice = int64_t{1} << 18;
  const at::Tensor flat = x.reshape({-1});
  at::Tensor sum = at::zeros({1}, flat.options().dtype(at::kDouble));
  for (int64_t first = 0; first < flat.numel(); first += kSlice)
    sum.add_(flat.narrow(0, first, std::min(kSlice, flat.numel() - first)).to(at::kDouble).square().sum());
  return sum;
}

}  // namespace mmsp::parallel
