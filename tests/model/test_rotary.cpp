// Rotary embeddings against a per-element reference written from Hugging Face's
// rules: Qwen2-VL splits the doubled mrope_section list over the head dim and takes
// chunk i from position row i % 3; Qwen3-VL starts from the t row and overwrites
// frequencies dim, dim+3, ... below 3·section[dim] with rows h (dim 1) and w (dim 2).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "mmsp/core/check.h"
#include "mmsp/model/layers/rotary.h"

using namespace mmsp;
using namespace mmsp::model;
using at::Tensor;

namespace {

int64_t reference_row(const RotaryOptions& o, int64_t d) {
  const int64_t half = o.head_dim / 2;
  if (o.mrope_section.empty()) return 0;
  if (o.interleaved) {
    const int64_t j = d % half;
    int64_t row = 0;
    for (int64_t dim = 1; dim <= 2; ++dim)
      for (int64_t k = dim; k < o.mrope_section[dim] * 3; k += 3)
        if (k == j) row = dim;
    return row;
  }
  std::vector<int64_t> chunks = o.mrope_section;
  chunks.insert(chunks.end(), o.mrope_section.begin(), o.mrope_section.end());  // section * 2
  int64_t start = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (d < start + chunks[i]) return static_cast<int64_t>(i % 3);
    start += chunks[i];
  }
  return -1;
}

Tensor reference_rotary(const Tensor& x, const Tensor& positions, const RotaryOptions& o) {
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  Tensor pos = positions.reshape({-1, T});
  Tensor out = at::empty_like(x);
  auto xa = x.accessor<double, 3>();
  auto oa = out.accessor<double, 3>();
  auto pa = pos.accessor<int64_t, 2>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t j = d % half;
      const double angle = pa[reference_row(o, d)][t] * std::pow(o.theta, -2.0 * j / static_cast<double>(D));
      for (int64_t h = 0; h < H; ++h) {
        const double partner = d < half ? -xa[t][h][d + half] : xa[t][h][d - half];
        oa[t][h][d] = xa[t][h][d] * std::cos(angle) + partner * std::sin(angle);
      }
    }
  return out;
}

void expect_matches(const RotaryOptions& o, const Tensor& positions) {
  const int64_t T = positions.size(-1);
  at::manual_seed(3);
  Tensor x = at::randn({T, 3, o.head_dim}, at::kDouble);
  Tensor got = apply_rotary(x, rotary_table(positions, o, at::kDouble, at::kCPU));
  Tensor expected = reference_rotary(x, positions, o);
  EXPECT_LT((got - expected).abs().max().item<double>(), 1e-12);
}

Tensor mrope_positions(int64_t T) {  // an image block: t constant, h and w vary
  Tensor p = at::empty({3, T}, at::kLong);
  for (int64_t i = 0; i < T; ++i) {
    p[0][i] = 5 + i / 12;
    p[1][i] = 5 + (i / 4) % 3;
    p[2][i] = 5 + i % 4 + 1000;
  }
  return p;
}

}  // namespace

TEST(RotaryTest, OneDimensionalMatchesReference) {
  RotaryOptions o;
  o.head_dim = 16;
  o.theta = 10000;
  expect_matches(o, at::arange(0, 50, at::kLong) * 37);
}

TEST(RotaryTest, Qwen2VlSectionsMatchReference) {
  RotaryOptions o;
  o.head_dim = 16;
  o.mrope_section = {2, 3, 3};
  expect_matches(o, mrope_positions(40));
}

TEST(RotaryTest, Qwen3VlInterleavedMatchesReference) {
  RotaryOptions o;
  o.head_dim = 32;
  o.mrope_section = {6, 5, 5};
  o.interleaved = true;
  expect_matches(o, mrope_positions(40));
  o.head_dim = 128;  // the released Qwen3-VL layout
  o.mrope_section = {24, 20, 20};
  expect_matches(o, mrope_positions(24));
}

// Text tokens have t = h = w: every mRoPE variant then is plain 1-D RoPE.
TEST(RotaryTest, TextPositionsReduceToOneDimensional) {
  Tensor p1 = at::arange(7, 60, at::kLong);
  Tensor p3 = p1.unsqueeze(0).repeat({3, 1});
  RotaryOptions plain;
  plain.head_dim = 16;
  at::manual_seed(1);
  Tensor x = at::randn({p1.size(0), 2, 16}, at::kDouble);
  Tensor ref = apply_rotary(x, rotary_table(p1, plain, at::kDouble, at::kCPU));
  for (bool interleaved : {false, true}) {
    RotaryOptions o = plain;
    o.mrope_section = {2, 3, 3};
    o.interleaved = interleaved;
    EXPECT_TRUE(at::allclose(apply_rotary(x, rotary_table(p3, o, at::kDouble, at::kCPU)), ref, 0, 1e-13));
  }
}

TEST(RotaryTest, BadOptionsNameTheValue) {
  RotaryOptions o;
  o.head_dim = 16;
  o.mrope_section = {2, 3, 4};
  try {
    rotary_table(mrope_positions(4), o, at::kDouble, at::kCPU);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("mrope_section sums to 9 but head_dim / 2 is 8"));
  }
  o.mrope_section = {2, 3, 3};
  EXPECT_THROW(rotary_table(at::arange(4, at::kLong), o, at::kDouble, at::kCPU), Error);
  o.head_dim = 15;
  EXPECT_THROW(rotary_table(mrope_positions(4), o, at::kDouble, at::kCPU), Error);
}
