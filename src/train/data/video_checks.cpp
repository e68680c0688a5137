// What the video decoder refuses beyond FFmpeg's own errors; see video_checks.h.
#include "data/video_checks.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/frame.h>
}

#include <cmath>
#include <cstdio>

#include "mmsp/core/check.h"

namespace mmsp::train::video {

namespace {

// The display matrix's transform of the frames ("" for none), after "to be shown ":
// FFmpeg's 3 x 3 matrix, 16.16 fixed point in its 2 x 2 part (libavutil/display.h).
std::string transform_of(const int32_t* m) {
  constexpr int32_t kOne = 1 << 16;
  if (m[0] == kOne && m[1] == 0 && m[3] == 0 && m[4] == kOne) return "";
  const double det = static_cast<double>(m[0]) * m[4] - static_cast<double>(m[1]) * m[3];
  const double angle = av_display_rotation_get(m);  // degrees counter-clockwise; NaN when degenerate
  char degrees[32];
  std::snprintf(degrees, sizeof degrees, "%g", angle);
  if (det < 0) return "mirrored (its display matrix flips the frames)";
  if (std::isfinite(angle) && std::fabs(angle) >= 0.5) return detail::concat("rotated by ", degrees, " degrees");
  return detail::concat("transformed by its display matrix [", m[0] / 65536.0, ", ", m[1] / 65536.0, "; ",
                        m[3] / 65536.0, ", ", m[4] / 65536.0, "]");
}

const char* const kNoTransform =
    ", which mmsp's decoder does not do (torchcodec 0.17 rotates such frames, so the pixels would differ from "
    "the processor's): rotate the pixels in the file (mmsp prepare refuses it too)";

const char* const kConcealed =
    ": the file is damaged (torchcodec would hand on the frame FFmpeg patched up): replace it with a good copy";

const uint8_t* stream_display_matrix(const AVStream& s, size_t& size) {
#if LIBAVCODEC_VERSION_INT >= AV_VERSION_INT(60, 29, 100)
  // FFmpeg 6.1 moved the stream's side data into its codec parameters.
  const AVPacketSideData* d =
      av_packet_side_data_get(s.codecpar->coded_side_data, s.codecpar->nb_coded_side_data, AV_PKT_DATA_DISPLAYMATRIX);
  size = d ? d->size : 0;
  return d ? d->data : nullptr;
#else
  return av_stream_get_side_data(&s, AV_PKT_DATA_DISPLAYMATRIX, &size);
#endif
}

}  // namespace

std::string av_error(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, text, sizeof(text));
  return text;
}

std::string timestamp_text(int64_t t) {
  return t == AV_NOPTS_VALUE ? std::string("no timestamp") : detail::concat("timestamp ", t);
}

std::string display_problem(const AVStream& stream) {
  size_t size = 0;
  const uint8_t* matrix = stream_display_matrix(stream, size);
  if (!matrix || size < 9 * sizeof(int32_t)) return "";
  const std::string transform = transform_of(reinterpret_cast<const int32_t*>(matrix));
  if (transform.empty()) return "";
  return detail::concat("a video whose stream asks to be shown ", transform, kNoTransform);
}

std::string frame_problem(const AVFrame& frame) {
  if (frame.decode_error_flags != 0) {
    std::string kinds;
    const std::pair<int, const char*> names[] = {{FF_DECODE_ERROR_INVALID_BITSTREAM, "invalid bitstream"},
                                                 {FF_DECODE_ERROR_MISSING_REFERENCE, "a missing reference"},
                                                 {FF_DECODE_ERROR_CONCEALMENT_ACTIVE, "concealment"},
                                                 {FF_DECODE_ERROR_DECODE_SLICES, "slices that did not decode"}};
    for (const auto& [bit, name] : names)
      if (frame.decode_error_flags & bit) kinds += kinds.empty() ? name : detail::concat(", ", name);
    return detail::concat("the decoder concealed errors in it (decode_error_flags ", frame.decode_error_flags, ": ",
                          kinds, ")", kConcealed);
  }
  if (frame.flags & AV_FRAME_FLAG_CORRUPT)
    return detail::concat("the decoder flags it corrupt (AV_FRAME_FLAG_CORRUPT)", kConcealed);
  const AVFrameSideData* d = av_frame_get_side_data(&frame, AV_FRAME_DATA_DISPLAYMATRIX);
  if (d && d->size >= 9 * sizeof(int32_t)) {
    const std::string transform = transform_of(reinterpret_cast<const int32_t*>(d->data));
    if (!transform.empty()) return detail::concat("it asks to be shown ", transform, kNoTransform);
  }
  return "";
}

std::string packet_problem(const AVPacket& packet) {
  return packet.flags & AV_PKT_FLAG_CORRUPT ? "the container flags its packet corrupt (AV_PKT_FLAG_CORRUPT)" : "";
}

}  // namespace mmsp::train::video
