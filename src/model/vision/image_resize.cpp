// PIL's bicubic resize of 8-bit images; see image_resize.h.
#include "mmsp/model/vision/image_resize.h"

#include <cmath>
#include <vector>

#include "mmsp/core/check.h"

namespace mmsp::model {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Resample.c's PRECISION_BITS

// Keys' cubic convolution with a = −0.5 (Resample.c's bicubic_filter), support 2.
double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One axis: for each output index its first input index, the count of inputs, and their
// fixed-point weights (precompute_coeffs + normalize_coeffs_8bpc).
struct Coefficients {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out, ksize]
};

Coefficients coefficients(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 2.0 * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);  // C's truncation, as PIL rounds
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = bicubic((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[x] / ww : k[x];
      c.weights[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(w < 0 ? -0.5 + w * (1 << kPrecisionBits) : 0.5 + w * (1 << kPrecisionBits));
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

uint8_t clip8(int64_t v) {
  if (v >= (int64_t{1} << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

// src [rows, in_w, C] → [rows, out_w, C] along the width (pixel stride C).
void resample_rows(const uint8_t* src, uint8_t* dst, int rows, int in_w, int out_w, int channels,
                   const Coefficients& c) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + static_cast<size_t>(y) * in_w * channels;
    uint8_t* out = dst + static_cast<size_t>(y) * out_w * channels;
    for (int xx = 0; xx < out_w; ++xx) {
      const int32_t* k = &c.weights[static_cast<size_t>(xx) * c.ksize];
      for (int ch = 0; ch < channels; ++ch) {
        int64_t ss = int64_t{1} << (kPrecisionBits - 1);
        for (int x = 0; x < c.count[xx]; ++x) ss += int64_t{in[(c.first[xx] + x) * channels + ch]} * k[x];
        out[xx * channels + ch] = clip8(ss);
      }
    }
  }
}

// src [in_h, W, C] → [out_h, W, C] along the height.
void resample_columns(const uint8_t* src, uint8_t* dst, int width, int out_h, int channels, const Coefficients& c) {
  const size_t row = static_cast<size_t>(width) * channels;
  for (int yy = 0; yy < out_h; ++yy) {
    const int32_t* k = &c.weights[static_cast<size_t>(yy) * c.ksize];
    for (size_t i = 0; i < row; ++i) {
      int64_t ss = int64_t{1} << (kPrecisionBits - 1);
      for (int y = 0; y < c.count[yy]; ++y) ss += int64_t{src[(c.first[yy] + y) * row + i]} * k[y];
      dst[yy * row + i] = clip8(ss);
    }
  }
}

}  // namespace

at::Tensor resize_bicubic_like_pil(const at::Tensor& image, int64_t height, int64_t width) {
  MMSP_CHECK(image.dim() == 3 && image.scalar_type() == at::kByte && image.size(2) >= 1 && image.size(2) <= 4,
             "resize_bicubic_like_pil: image must be [H, W, C] uint8 with C in 1..4, got ", image.sizes(), " ",
             image.scalar_type());
  MMSP_CHECK(height >= 1 && width >= 1 && height <= (1 << 20) && width <= (1 << 20) && image.size(0) >= 1 &&
                 image.size(1) >= 1,
             "resize_bicubic_like_pil: sizes must be in 1..2^20, got ", image.size(1), " x ", image.size(0), " -> ",
             width, " x ", height);
  const at::Tensor in = image.contiguous();
  const int in_h = static_cast<int>(in.size(0)), in_w = static_cast<int>(in.size(1));
  const int channels = static_cast<int>(in.size(2)), out_h = static_cast<int>(height), out_w = static_cast<int>(width);
  if (in_h == out_h && in_w == out_w) return in.clone();
  const Coefficients vertical = coefficients(in_h, out_h);
  // Pillow 13 runs the vertical pass first when the height shrinks by more than twice
  // as many pixels as the width does (ImagingResampleInner), else the horizontal one:
  // the order changes the rounding between the passes, so it is Pillow's.
  const bool horizontal_first = !(in_h - out_h > 0 && in_h - out_h > (in_w - out_w) * 2);
  if (!horizontal_first) {
    at::Tensor tall = at::empty({out_h, in_w, channels}, at::kByte);
    resample_columns(in.data_ptr<uint8_t>(), tall.data_ptr<uint8_t>(), in_w, out_h, channels, vertical);
    if (in_w == out_w) return tall;
    at::Tensor out = at::empty({out_h, out_w, channels}, at::kByte);
    resample_rows(tall.data_ptr<uint8_t>(), out.data_ptr<uint8_t>(), out_h, in_w, out_w, channels,
                  coefficients(in_w, out_w));
    return out;
  }
  // Horizontal first, over the input rows the vertical pass reads.
  at::Tensor wide = in;
  int row0 = 0;
  if (in_w != out_w) {
    const int row_end = vertical.first.back() + vertical.count.back();
    row0 = vertical.first.front();
    wide = at::empty({row_end - row0, out_w, channels}, at::kByte);
    resample_rows(in.data_ptr<uint8_t>() + static_cast<size_t>(row0) * in_w * channels, wide.data_ptr<uint8_t>(),
                  row_end - row0, in_w, out_w, channels, coefficients(in_w, out_w));
  }
  if (in_h == out_h) return wide;
  Coefficients shifted = vertical;
  for (int& f : shifted.first) f -= row0;
  at::Tensor out = at::empty({out_h, out_w, channels}, at::kByte);
  resample_columns(wide.data_ptr<uint8_t>(), out.data_ptr<uint8_t>(), out_w, out_h, channels, shifted);
  return out;
}

at::Tensor resize_unit_float_like_pil(const at::Tensor& image, int64_t height, int64_t width) {
  MMSP_CHECK(image.dim() == 3, "resize_unit_float_like_pil: image must be [C, H, W], got ", image.sizes());
  if (image.size(1) == height && image.size(2) == width) return image;
  const at::Tensor bytes = image.mul(255.0).round_().clamp_(0, 255).to(at::kByte).permute({1, 2, 0}).contiguous();
  return resize_bicubic_like_pil(bytes, height, width).permute({2, 0, 1}).to(at::kFloat).div_(255.0f).contiguous();
}

}  // namespace mmsp::model
