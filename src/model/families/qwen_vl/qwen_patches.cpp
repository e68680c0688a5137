// Hugging Face's Qwen2-VL processor layout as one reshape + permute over the frames;
// see qwen_patches.h.
#include "mmsp/model/families/qwen_vl/qwen_patches.h"

#include "mmsp/core/check.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"

namespace mmsp::model {

namespace {

// Normalised frames [T, C, H, W] -> the rows (see qwen_patches.h).
QwenPatches patch_rows(at::Tensor x, const QwenVisionConfig& vision) {
  const int64_t p = vision.patch_size, m = vision.spatial_merge_size, tp = vision.temporal_patch_size;
  const int64_t T = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
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

void check_frames(const at::Tensor& frames, const QwenVisionConfig& vision) {
  const int64_t p = vision.patch_size, m = vision.spatial_merge_size;
  MMSP_CHECK(frames.dim() == 4, "qwen_patches: frames must be [T, C, H, W], got ", frames.sizes());
  const int64_t T = frames.size(0), C = frames.size(1), H = frames.size(2), W = frames.size(3);
  MMSP_CHECK(T >= 1, "qwen_patches: frames ", frames.sizes(), " hold no frame");
  MMSP_CHECK(C == vision.in_channels && C <= 3, "qwen_patches: frames ", frames.sizes(), " have ", C,
             " channels but vision_config.in_channels is ", vision.in_channels,
             " (mmsp's pixel pipeline handles 1 to 3 channels)");
  MMSP_CHECK(H >= p * m && W >= p * m && H % (p * m) == 0 && W % (p * m) == 0, "qwen_patches: frame size ", H, " x ", W,
             " (H x W) must be a positive multiple of ", "patch_size * spatial_merge_size = ", p * m, " on each side");
}

}  // namespace

QwenPatches qwen_patches(const at::Tensor& frames, const QwenVisionConfig& vision, const PixelNorm& norm) {
  check_frames(frames, vision);
  return patch_rows(normalize_pixels(frames, 1, norm), vision);
}

QwenPatches qwen_video_patches(const at::Tensor& frames, const QwenVisionConfig& vision, const PixelNorm& norm) {
  check_frames(frames, vision);
  MMSP_CHECK(frames.scalar_type() == at::kByte, "qwen_video_patches: frames must be uint8, got ", frames.scalar_type());
  return patch_rows(normalize_pixels_fused(frames, 1, norm), vision);
}

}  // namespace mmsp::model
