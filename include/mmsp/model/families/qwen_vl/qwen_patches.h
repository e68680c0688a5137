// Pixels into the layout the Qwen-VL vision towers read: Hugging Face's Qwen2-VL image
// processor's rows of flattened patches (Qwen2.5-VL, Qwen3-VL and Qwen3.5 keep it).
// Decoding and resizing files is the datasets' business, not this file's.
#pragma once

#include <ATen/ATen.h>

#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/vision/pixel_geometry.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::model {

struct QwenPatches {
  at::Tensor rows;  // [t·h·w, C·tp·p·p] float32
  plan::Grid grid;  // [t, h, w] in patches: t = ceil(T / tp), h = H / p, w = W / p
};

// frames: [T, C, H, W] float in 0..1 (T = 1: an image), H and W multiples of
// patch_size · spatial_merge_size, C = in_channels (at most 3). Frames are padded to a
// multiple of temporal_patch_size by repeating the last one (an image is repeated
// temporal_patch_size times), normalised, and cut as the processor does:
//   [gt, tp, C, gh/m, m, p, gw/m, m, p] -> (gt, gh/m, gw/m, m, m | C, tp, p, p)
// so each row is one patch (channels × time × rows × columns) and rows run over merge
// windows, t-major: the order the encoder's merger and the placeholders expect.
QwenPatches qwen_patches(const at::Tensor& frames, const QwenVisionConfig& vision, const PixelNorm& norm);

// The same from uint8 frames [T, C, H, W] (0..255) normalised as transformers' video
// processors do (normalize_pixels_fused): the videos' rows.
QwenPatches qwen_video_patches(const at::Tensor& frames, const QwenVisionConfig& vision, const PixelNorm& norm);

}  // namespace mmsp::model
