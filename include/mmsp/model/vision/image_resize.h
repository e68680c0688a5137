// Image resizing as the Hugging Face image processors do it: their PIL backend calls
// PIL.Image.resize(..., BICUBIC) on the 8-bit image, so mmsp does the same arithmetic,
// to the bit: PIL's two-pass separable convolution, a cubic
// kernel with a = −0.5 widened by the scale when shrinking (antialiasing), coefficients
// normalised per output pixel and rounded to 22-bit fixed point, each pass rounded and
// clamped to 8 bits, the passes in Pillow 13's order (libImaging/Resample.c). Checked
// against PIL itself, value for value, in tests/hf/test_pixels.py. Another resampler
// (stb_image_resize, torch's bicubic) differed from it by up to 4/255.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace mmsp::model {

// image [H, W, C] uint8 (C ≤ 4, contiguous) → [height, width, C] uint8.
at::Tensor resize_bicubic_like_pil(const at::Tensor& image, int64_t height, int64_t width);

// The same on [C, H, W] float values in 0..1 that came from 8-bit pixels (x = k / 255):
// rounded back to those bytes, resized, returned as [C, height, width] float32 in 0..1.
at::Tensor resize_unit_float_like_pil(const at::Tensor& image, int64_t height, int64_t width);

}  // namespace mmsp::model
