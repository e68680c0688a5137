// The normalisation every family's processor applies; see pixel_geometry.h.
#include "mmsp/model/pixel_geometry.h"

#include "mmsp/core/check.h"

namespace mmsp::model {

at::Tensor normalize_pixels(const at::Tensor& x, int64_t channel_dim, const PixelNorm& norm) {
  const int64_t c = x.size(channel_dim);
  MMSP_CHECK(c >= 1 && c <= 3, "normalize_pixels: ", c, " channels in dim ", channel_dim, " of ", x.sizes(),
             " (mmsp's pixel pipeline handles 1 to 3 channels)");
  std::vector<int64_t> shape(x.dim(), 1);
  shape[channel_dim] = c;
  const at::Tensor mean =
      at::tensor(std::vector<double>(norm.mean.begin(), norm.mean.begin() + c)).to(at::kFloat).view(shape);
  const at::Tensor std =
      at::tensor(std::vector<double>(norm.std.begin(), norm.std.begin() + c)).to(at::kFloat).view(shape);
  return (x.to(at::kFloat) - mean) / std;
}

at::Tensor normalize_pixels_fused(const at::Tensor& x, int64_t channel_dim, const PixelNorm& norm) {
  const int64_t c = x.size(channel_dim);
  MMSP_CHECK(c >= 1 && c <= 3, "normalize_pixels_fused: ", c, " channels in dim ", channel_dim, " of ", x.sizes(),
             " (mmsp's pixel pipeline handles 1 to 3 channels)");
  std::vector<int64_t> shape(x.dim(), 1);
  shape[channel_dim] = c;
  // torch.tensor(mean) (float32) * (1 / rescale_factor): a float32 product with 255.
  const auto scaled = [&](const std::array<double, 3>& v) {
    return (at::tensor(std::vector<double>(v.begin(), v.begin() + c)).to(at::kFloat) * 255.0f).view(shape);
  };
  // In place on the float copy (one frame-sized buffer, not three): the same two roundings.
  return x.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).sub_(scaled(norm.mean)).div_(scaled(norm.std));
}

at::Tensor PixelGeometry::video_pixels(const at::Tensor& frames) const {
  MMSP_FAIL("this model takes no videos (frames ", frames.sizes(), ")");
}

}  // namespace mmsp::model
