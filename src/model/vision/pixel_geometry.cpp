// The normalisation every family's processor applies; see pixel_geometry.h.
#include "mmsp/model/vision/pixel_geometry.h"

#include "mmsp/core/check.h"

namespace mmsp::model {

namespace {

// The first `c` of `v` (the norm's mean or std), times `scale` as a float32 product, shaped
// to broadcast over dim `channel_dim` of x; checks x's channel count.
at::Tensor per_channel(const at::Tensor& x, int64_t channel_dim, const std::array<double, 3>& v, float scale,
                       const char* what) {
  const int64_t c = x.size(channel_dim);
  MMSP_CHECK(c >= 1 && c <= 3, what, ": ", c, " channels in dim ", channel_dim, " of ", x.sizes(),
             " (mmsp's pixel pipeline handles 1 to 3 channels)");
  std::vector<int64_t> shape(x.dim(), 1);
  shape[channel_dim] = c;
  at::Tensor t = at::tensor(std::vector<double>(v.begin(), v.begin() + c)).to(at::kFloat);
  return (scale == 1.0f ? t : t * scale).view(shape);
}

}  // namespace

at::Tensor normalize_pixels(const at::Tensor& x, int64_t channel_dim, const PixelNorm& norm) {
  return (x.to(at::kFloat) - per_channel(x, channel_dim, norm.mean, 1.0f, "normalize_pixels")) /
         per_channel(x, channel_dim, norm.std, 1.0f, "normalize_pixels");
}

at::Tensor normalize_pixels_fused(const at::Tensor& x, int64_t channel_dim, const PixelNorm& norm) {
  // torch.tensor(mean) (float32) * (1 / rescale_factor): a float32 product with 255. In place
  // on the float copy (one frame-sized buffer, not three): the same two roundings.
  const at::Tensor mean = per_channel(x, channel_dim, norm.mean, 255.0f, "normalize_pixels_fused");
  const at::Tensor std = per_channel(x, channel_dim, norm.std, 255.0f, "normalize_pixels_fused");
  return x.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).sub_(mean).div_(std);
}

at::Tensor PixelGeometry::video_pixels(const at::Tensor& frames) const {
  MMSP_FAIL("this model takes no videos (frames ", frames.sizes(), ")");
}

}  // namespace mmsp::model
