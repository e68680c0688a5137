// Rotary tables and their application; see rotary.h. Mirrors Hugging Face's
// apply_multimodal_rotary_pos_emb (Qwen2-VL) and apply_interleaved_mrope (Qwen3-VL).
#include "mmsp/model/layers/rotary.h"

#include <ATen/ATen.h>

#include <numeric>

#include "mmsp/core/check.h"

namespace mmsp::model {
namespace {

// For each frequency j < D/2: which position row (0 = t, 1 = h, 2 = w) drives it.
std::vector<int64_t> frequency_rows(const RotaryOptions& o) {
  const int64_t half = o.head_dim / 2;
  std::vector<int64_t> rows(half, 0);
  if (o.mrope_section.empty()) return rows;
  if (o.interleaved) {
    for (int64_t axis = 1; axis <= 2; ++axis)
      for (int64_t j = axis; j < 3 * o.mrope_section[axis] && j < half; j += 3) rows[j] = axis;
    return rows;
  }
  int64_t j = 0;
  for (int64_t axis = 0; axis < 3; ++axis)
    for (int64_t n = 0; n < o.mrope_section[axis]; ++n) rows[j++] = axis;
  return rows;
}

}  // namespace

RotaryTable rotary_table(const at::Tensor& positions, const RotaryOptions& o, at::ScalarType dtype,
                         const at::Device& device) {
  MMSP_CHECK(o.head_dim > 0 && o.head_dim % 2 == 0, "rotary head_dim must be even, got ", o.head_dim);
  const int64_t half = o.head_dim / 2;
  if (!o.mrope_section.empty()) {
    MMSP_CHECK(o.mrope_section.size() == 3, "mrope_section must have 3 entries (t, h, w), got ",
               o.mrope_section.size());
    const int64_t sum = std::accumulate(o.mrope_section.begin(), o.mrope_section.end(), int64_t{0});
    MMSP_CHECK(sum == half, "mrope_section sums to ", sum, " but head_dim / 2 is ", half);
    MMSP_CHECK(positions.dim() == 2 && positions.size(0) == 3, "mRoPE positions must be [3, T], got ",
               positions.sizes());
  } else {
    MMSP_CHECK(positions.dim() == 1 || (positions.dim() == 2 && positions.size(0) == 1),
               "1-D RoPE positions must be [T] or [1, T], got ", positions.sizes());
  }
  // Angles in fp64 (positions up to millions times frequencies), rounded once.
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor inv_freq = at::pow(o.theta, at::arange(0, o.head_dim, 2, f64) / double(o.head_dim)).reciprocal();
  at::Tensor pos = positions.to(at::kDouble).reshape({-1, positions.size(-1)});  // [rows, T]
  std::vector<int64_t> rows = frequency_rows(o);
  at::Tensor row_index = at::tensor(at::ArrayRef<int64_t>(rows), at::kLong).clone();
  // angle[t, j] = pos[row(j), t] * inv_freq[j]
  at::Tensor chosen = pos.index_select(0, row_index.clamp_max(pos.size(0) - 1)).t();  // [T, D/2]
  at::Tensor angles = chosen * inv_freq.unsqueeze(0);
  at::Tensor emb = at::cat({angles, angles}, 1);  // [T, D]
  return {emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)};
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table) {
  MMSP_CHECK(x.dim() == 3 && x.size(0) == table.cos.size(0) && x.size(2) == table.cos.size(1), "apply_rotary: x ",
             x.sizes(), " does not match the table ", table.cos.sizes());
  const int64_t half = x.size(2) / 2;
  at::Tensor rotated = at::cat({-x.narrow(2, half, half), x.narrow(2, 0, half)}, 2);
  return x * table.cos.unsqueeze(1) + rotated * table.sin.unsqueeze(1);
}

}  // namespace mmsp::model
