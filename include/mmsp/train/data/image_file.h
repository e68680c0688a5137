// Image files read as transformers' image processors read them: PIL's
// `Image.open(path).convert("RGB")`, value for value.
//
// JPEG goes through libjpeg-turbo with the settings PIL decodes with (the accurate integer
// IDCT, fancy upsampling, libjpeg's YCbCr → RGB); stb_image's own JPEG decoder was up to 3
// levels off PIL on 5–6 % of values (106 levels on 4:2:2 of an odd width). PNG, BMP, GIF,
// TGA, PSD and PNM go through stb_image, which gives PIL's pixels for every 8-bit mode
// (grey, palette, transparency, alpha: dropped, as convert("RGB") drops it) and for 16-bit
// colour (both keep the high byte). Where PIL gives other pixels and mmsp would not match
// them, the file is refused by its header, naming the rule: a 16-bit grey image (PIL clips
// each value at 255: all but the darkest 256 levels of 65,536 turn white) and a CMYK JPEG
// (PIL's own CMYK → RGB formula). tests/hf/test_pixels.py checks each format against the
// processor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <ATen/ATen.h>

namespace mmsp::train {

// What a file's header says, read without decoding its pixels. `problem` is empty when
// mmsp reads the file as PIL does; otherwise it says why not (the sides are still filled
// in when the header gave them, so that a too-large image is named by its size).
struct ImageFileHeader {
  int64_t width = 0, height = 0;
  std::string problem;
};

ImageFileHeader read_image_header(const std::filesystem::path& file);

// The whole image as [H, W, channels] uint8: RGB for 3 channels, PIL's "L" (ITU-R 601-2
// luma, PIL's fixed point) for 1. Throws Error naming the file when it cannot be decoded
// (a JPEG that ends early included: PIL calls it truncated).
at::Tensor decode_image_file(const std::filesystem::path& file, int64_t channels);

}  // namespace mmsp::train
