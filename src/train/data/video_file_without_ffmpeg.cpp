// A build without FFmpeg (its libraries were not found at configure time): video files are
// refused by name, frame folders still train; see video_file.h.
#include "mmsp/train/data/video_file.h"

#include "mmsp/core/check.h"

namespace mmsp::train {

namespace {
const char* const kWhy =
    "not readable by this mmsp: it was built without FFmpeg (install Debian's libavformat-dev, libavcodec-dev, "
    "libavfilter-dev, libswscale-dev and pkg-config, then configure again), or give the video as a folder of frames";
}

VideoFileHeader read_video_header(const std::filesystem::path&) {
  VideoFileHeader h;
  h.problem = kWhy;
  return h;
}

at::Tensor decode_video_frames(const std::filesystem::path& file, const std::vector<int64_t>&, VideoDecodeCounts*) {
  MMSP_FAIL("video file \"", file.string(), "\" is ", kWhy);
}

}  // namespace mmsp::train
