// Pixels into the layout the vision encoders read: Hugging Face's Qwen2-VL image
// processor's rows of flattened patches (Qwen families) and the normalised [C, S, S]
// image (LLaVA). Decoding and resizing files is the datasets' business, not this file's.
#pragma once

#include <array>

#include <ATen/ATen.h>

#include "mmsp/model/config.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::train {

// Per-channel normalisation x -> (x - mean[c]) / std[c] of pixels in 0..1.
struct PixelNorm {
  std::array<double, 3> mean{0.48145466, 0.4578275, 0.40821073};  // OpenAI CLIP
  std::array<double, 3> std{0.26862954, 0.26130258, 0.27577711};
};

// The released processors' values: OpenAI CLIP's for Qwen2-VL, Qwen2.5-VL and LLaVA-1.5;
// 0.5 / 0.5 for Qwen3-VL (its preprocessor_config.json); ImageNet's for InternVL.
PixelNorm pixel_norm(plan::ModelFamily family);

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
QwenPatches qwen_patches(const at::Tensor& frames, const model::QwenVisionConfig& vision,
                         const PixelNorm& norm);

// image: [C, H, W] float in 0..1 -> normalised [C, H, W] float32 (LLaVA's pixel_values row).
at::Tensor normalize_image(const at::Tensor& image, const PixelNorm& norm);

}  // namespace mmsp::train
