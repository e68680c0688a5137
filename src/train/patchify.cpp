// Hugging Face's Qwen2-VL processor layout as one reshape + permute over the frames.
#include "mmsp/train/patchify.h"

#include <vector>

#include "mmsp/core/check.h"

namespace mmsp::train {

namespace {

// (x - mean) / std over dim `channel_dim` of x, in float32.
at::Tensor normalize(const at::Tensor& x, int64_t channel_dim, const PixelNorm& norm) {
  const int64_t c = x.size(channel_dim);
  std::vector<int64_t> shape(x.dim(), 1);
  shape[channel_dim] = c;
  const at::Tensor mean = at::tensor(std::vector<double>(norm.mean.begin(), norm.mean.begin() + c))
                              .to(at::kFloat).view(shape);
  const at::Tensor std = at::tensor(std::vector<double>(norm.std.begin(), norm.std.begin() + c))
                             .to(at::kFloat).view(shape);
  return (x.to(at::kFloat) - mean) / std;
}

}  // namespace

PixelNorm pixel_norm(plan::ModelFamily family) {
  PixelNorm n;
  if (family == plan::ModelFamily::qwen3_vl) n.mean = n.std = {0.5, 0.5, 0.5};
  if (family == plan::ModelFamily::internvl) {  // InternVL3-hf's preprocessor_config.json: ImageNet's
    n.mean = {0.485, 0.456, 0.406};
    n.std = {0.229, 0.224, 0.225};
  }
  return n;
}

at::Tensor normalize_image(const at::Tensor& image, const PixelNorm& norm) {
  MMSP_CHECK(image.dim() == 3 && image.size(0) >= 1 && image.size(0) <= 3,
             "normalize_image: image must be [C, H, W] with 1 to 3 channels, got ", image.sizes());
  return normalize(image, 0, norm).contiguous();
}

QwenPatches qwen_patches(const at::Tensor& frames, const model::QwenVisionConfig& vision,
                         const PixelNorm& norm) {
  const int64_t p = vision.patch_size, m = vision.spatial_merge_size, tp = vision.temporal_patch_size;
  MMSP_CHECK(frames.dim() == 4, "qwen_patches: frames must be [T, C, H, W], got ", frames.sizes());
  const int64_t T = frames.size(0), C = frames.size(1), H = frames.size(2), W = frames.size(3);
  MMSP_CHECK(T >= 1, "qwen_patches: frames ", frames.sizes(), " hold no frame");
  MMSP_CHECK(C == vision.in_channels && C <= 3, "qwen_patches: frames ", frames.sizes(), " have ", C,
             " channels but vision_config.in_channels is ", vision.in_channels,
             " (mmsp's pixel pipeline handles 1 to 3 channels)");
  MMSP_CHECK(H >= p * m && W >= p * m && H % (p * m) == 0 && W % (p * m) == 0,
             "qwen_patches: frame size ", H, " x ", W, " (H x W) must be a positive multiple of ",
             "patch_size * spatial_merge_size = ", p * m, " on each side");
  at::Tensor x = normalize(frames, 1, norm);  // [T, C, H, W]
  const int64_t gt = (T + tp - 1) / tp;
  if (gt * tp != T)  // repeat the last frame (an image becomes tp identical frames)
    x = at::cat({x, x.narrow(0, T - 1, 1).expand({gt * tp - T, C, H, W})}, 0);
  const int64_t gh = H / p, gw = W / p;
  // [gt, tp, C, gh/m, m, p, gw/m, m, p] -> [gt, gh/m, gw/m, m, m, C, tp, p, p]
  at::Tensor rows = x.reshape({gt, tp, C, gh / m, m, p, gw / m, m, p})
                        .permute({0, 3, 6, 4, 7, 2, 1, 5, 8})
                        .reshape({gt * gh * gw, C * tp * p * p})
                        .contiguous();
  return {rows, plan::Grid{gt, gh, gw}};
}

}  // namespace mmsp::train
