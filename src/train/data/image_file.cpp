// Image files decoded as PIL decodes them (include/mmsp/train/data/image_file.h).
#include "mmsp/train/data/image_file.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>
#include <stb/stb_image.h>

#include "mmsp/core/check.h"

namespace mmsp::train {

namespace {

namespace fs = std::filesystem;

using File = std::unique_ptr<FILE, int (*)(FILE*)>;

File open_file(const fs::path& file) { return File(std::fopen(file.string().c_str(), "rb"), std::fclose); }

// A JPEG starts with SOI (FF D8) and a marker (FF); stb_image and PIL tell it the same way.
bool is_jpeg(const fs::path& file) {
  unsigned char b[3] = {};
  const File f = open_file(file);
  return f && std::fread(b, 1, 3, f.get()) == 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}

// Width and height from a PNG file's IHDR chunk (signature, length, "IHDR", two
// big-endian 32-bit numbers), or nothing when the file is no PNG.
std::optional<std::pair<int64_t, int64_t>> png_header_size(const fs::path& file) {
  unsigned char b[24] = {};
  const File f = open_file(file);
  if (!f || std::fread(b, 1, sizeof b, f.get()) != sizeof b) return std::nullopt;
  static const unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (std::memcmp(b, kSignature, 8) != 0 || std::memcmp(b + 12, "IHDR", 4) != 0) return std::nullopt;
  const auto be32 = [&](int at) {
    return (int64_t{b[at]} << 24) | (int64_t{b[at + 1]} << 16) | (int64_t{b[at + 2]} << 8) | int64_t{b[at + 3]};
  };
  return std::make_pair(be32(16), be32(20));
}

// ---- JPEG (libjpeg-turbo) ----

// libjpeg reports a fatal error by calling error_exit, which must not return: it jumps back
// to the setjmp in `guarded` with the message kept. A JPEG whose data ends early is only a
// warning to libjpeg (it pads with grey); PIL refuses it as truncated, so it is kept too.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

void jpeg_fail(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_note(j_common_ptr info, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  if (level < 0 && info->err->msg_code == JWRN_JPEG_EOF) errors->truncated = true;
}

// One decompression; the struct is destroyed however it ends. Only trivially destructible
// state lives in the frames a longjmp crosses (`guarded` and the lambdas it runs).
struct JpegReader {
  jpeg_decompress_struct info{};
  JpegErrors errors{};
  bool created = false;
  bool header_read = false;  // image_width, image_height and jpeg_color_space are set

  JpegReader() {
    info.err = jpeg_std_error(&errors.mgr);
    errors.mgr.error_exit = jpeg_fail;
    errors.mgr.emit_message = jpeg_note;
  }
  ~JpegReader() {
    if (created) jpeg_destroy_decompress(&info);
  }
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;

  // Runs `step` (libjpeg calls only); false, with errors.message set, when libjpeg gave up.
  template <typename Step>
  bool guarded(Step&& step) {
    if (setjmp(errors.jump) != 0) return false;
    step();
    return true;
  }

  // Reads the header from `file`; an empty string, or why the file is not read as PIL reads it.
  std::string read_header(FILE* file) {
    if (!guarded([&] {
          jpeg_create_decompress(&info);
          created = true;
          jpeg_stdio_src(&info, file);
          jpeg_read_header(&info, TRUE);
          header_read = true;
        }))
      return detail::concat("not a JPEG libjpeg can read (", errors.message, ")");
    switch (info.jpeg_color_space) {
      case JCS_GRAYSCALE:
      case JCS_YCbCr:
      case JCS_RGB:
        return {};
      default:
        return detail::concat("a JPEG of ", info.num_components,
                              " components in CMYK or YCCK: transformers' processors convert it to RGB by PIL's "
                              "own formula, which mmsp does not reproduce; save it as an RGB JPEG or a PNG");
    }
  }
};

// PIL's "L" from RGB: ITU-R 601-2 luma in PIL's 16-bit fixed point (Convert.c, L24).
at::Tensor luma_like_pil(const at::Tensor& rgb) {
  const at::Tensor c = rgb.to(at::kInt);
  const at::Tensor l =
      at::bitwise_right_shift(c.select(2, 0) * 19595 + c.select(2, 1) * 38470 + c.select(2, 2) * 7471 + 0x8000, 16);
  return l.to(at::kByte).unsqueeze(2).contiguous();
}

// Grey (PIL "L") to what was asked for: RGB repeats it, as PIL's convert("RGB") does.
at::Tensor grey_to(const at::Tensor& grey, int64_t channels) {
  return channels == 1 ? grey : grey.expand({grey.size(0), grey.size(1), channels}).contiguous();
}

at::Tensor decode_jpeg(const fs::path& file, int64_t channels) {
  const File f = open_file(file);
  MMSP_CHECK(f != nullptr, "cannot open \"", file.string(), "\"");
  JpegReader r;
  const std::string problem = r.read_header(f.get());
  MMSP_CHECK(problem.empty(), "cannot decode \"", file.string(), "\": ", problem);
  const bool grey = r.info.jpeg_color_space == JCS_GRAYSCALE;
  at::Tensor out;
  const bool started = r.guarded([&] {
    // PIL's settings (libImaging/JpegDecode.c without draft mode), stated rather than assumed.
    r.info.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
    r.info.dct_method = JDCT_ISLOW;
    r.info.do_fancy_upsampling = TRUE;
    r.info.scale_num = r.info.scale_denom = 1;
    jpeg_start_decompress(&r.info);
  });
  MMSP_CHECK(started, "cannot decode \"", file.string(), "\": ", r.errors.message);
  out = at::empty({r.info.output_height, r.info.output_width, r.info.output_components}, at::kByte);
  auto* rows = out.data_ptr<uint8_t>();
  const auto stride = static_cast<size_t>(r.info.output_width) * r.info.output_components;
  const bool read = r.guarded([&] {
    while (r.info.output_scanline < r.info.output_height) {
      JSAMPROW row = rows + static_cast<size_t>(r.info.output_scanline) * stride;
      jpeg_read_scanlines(&r.info, &row, 1);
    }
    jpeg_finish_decompress(&r.info);
  });
  MMSP_CHECK(read, "cannot decode \"", file.string(), "\": ", r.errors.message);
  MMSP_CHECK(!r.errors.truncated, "cannot decode \"", file.string(),
             "\": the JPEG data ends early (a truncated file, which PIL refuses as well)");
  if (grey) return grey_to(out, channels);
  return channels == 1 ? luma_like_pil(out) : out;
}

ImageFileHeader jpeg_header(const fs::path& file) {
  const File f = open_file(file);
  JpegReader r;
  ImageFileHeader h;
  h.problem = f ? r.read_header(f.get()) : std::string("a file that cannot be opened");
  if (r.header_read) h.width = r.info.image_width, h.height = r.info.image_height;
  return h;
}

// ---- the other formats (stb_image) ----

ImageFileHeader stb_header(const fs::path& file) {
  ImageFileHeader h;
  int w = 0, h_ = 0, n = 0;
  if (!stbi_info(file.string().c_str(), &w, &h_, &n)) {
    // stb_image gives up on PNGs beyond its own limits with "unknown image type": the PNG
    // header still gives the size, so that a too-large image is named by it.
    const auto png = png_header_size(file);
    if (png) h.width = png->first, h.height = png->second;
    h.problem = detail::concat(
        "not an image stb_image can read (", stbi_failure_reason(),
        png ? detail::concat("; its PNG header says ", png->first, " x ", png->second) : std::string(), ")");
    return h;
  }
  h.width = w, h.height = h_;
  if (n == 1 && stbi_is_16_bit(file.string().c_str()))
    h.problem =
        "a 16-bit grey image: transformers' processors (PIL's I;16 → RGB) clip each value at 255, so all "
        "but the darkest 256 of its 65,536 levels turn white; save it with 8 bits a value (the high "
        "byte) first";
  return h;
}

at::Tensor decode_stb(const fs::path& file, int64_t channels) {
  int w = 0, h = 0, n = 0;
  // Always RGB: stb's own grey conversion is not PIL's.
  std::unique_ptr<unsigned char, void (*)(void*)> data(stbi_load(file.string().c_str(), &w, &h, &n, 3),
                                                       stbi_image_free);
  MMSP_CHECK(data != nullptr, "cannot decode \"", file.string(), "\": ", stbi_failure_reason());
  const at::Tensor rgb = at::from_blob(data.get(), {h, w, 3}, at::kByte).clone();
  return channels == 1 ? luma_like_pil(rgb) : rgb;
}

}  // namespace

ImageFileHeader read_image_header(const fs::path& file) { return is_jpeg(file) ? jpeg_header(file) : stb_header(file); }

at::Tensor decode_image_file(const fs::path& file, int64_t channels) {
  MMSP_CHECK(channels == 1 || channels == 3, "decode_image_file: ", channels, " channels asked of \"", file.string(),
             "\"; an image file gives 1 (grey) or 3 (RGB)");
  if (is_jpeg(file)) return decode_jpeg(file, channels);  // which reads and checks its header once
  const ImageFileHeader header = stb_header(file);
  MMSP_CHECK(header.problem.empty(), "cannot decode \"", file.string(), "\": ", header.problem);
  return decode_stb(file, channels);
}

}  // namespace mmsp::train
