// Rotary position embedding for the decoder: 1-D RoPE (Llama/LLaVA, InternVL) and the
// 3-D mRoPE of Qwen2-VL / Qwen2.5-VL (t/h/w frequency sections side by side) and
// Qwen3-VL (sections interleaved). Positions come from the plan, one column per
// local token; this file only turns them into rotations.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace mmsp::model {

struct RotaryOptions {
  int64_t head_dim = 128;              // D (even)
  double theta = 1000000.0;            // rope_theta
  std::vector<int64_t> mrope_section;  // empty: 1-D RoPE; else (t, h, w) sizes summing to D/2
  bool interleaved = false;            // Qwen3-VL: frequency j takes h if j%3==1, w if j%3==2 (within its section)
};

// cos, sin [T, D] for positions int64 [T] (1-D) or [3, T] (t, h, w), in dtype on device.
struct RotaryTable {
  at::Tensor cos, sin;
};
RotaryTable rotary_table(const at::Tensor& positions, const RotaryOptions& options, at::ScalarType dtype,
                         const at::Device& device);

// x [T, H, D] rotated: x·cos + rotate_half(x)·sin, rotate_half(x) = (−x₂, x₁).
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table);

}  // namespace mmsp::model
