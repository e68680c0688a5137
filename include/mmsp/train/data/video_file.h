// Video files read as transformers' video processors read them: torchcodec's
// `VideoDecoder(path).get_frames_at(indices)` (what transformers 5.17's fetch_videos calls),
// frame for frame, value for value.
//
// Both decode with FFmpeg's libraries (Debian's libavformat/libavcodec) and convert each
// frame to RGB24 as torchcodec 0.17 does on the CPU: libswscale with no scaler flags and the
// frame's colour matrix when the width is a multiple of 32, else a filter graph
// (buffer -> copy -> buffersink of rgb24), whose automatic scale filter does the conversion.
// Frame i is the i-th frame the decoder gives, in presentation order, which is how
// torchcodec numbers frames in its exact seek mode. tests/hf/test_video_pixels.py compares
// them with torchcodec's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace mmsp::train {

// What a video file's container says, read without decoding a frame. `problem` is empty when
// the file has a video stream FFmpeg can decode; otherwise it says why not.
struct VideoFileHeader {
  int64_t width = 0, height = 0;
  int64_t frames = -1;  // the stream's frame count from the header; -1 when it gives none
  std::string codec;
  std::string problem;
};

VideoFileHeader read_video_header(const std::filesystem::path& file);

// Frames `indices` (any order, repeats allowed) as [N, H, W, 3] uint8 RGB, in the order
// asked. Decodes from the start up to the last frame asked. Throws Error naming the file
// and the rule: no video stream, a frame index past the stream's end (naming its frame
// count), frames of different sizes, a decode failure.
at::Tensor decode_video_frames(const std::filesystem::path& file, const std::vector<int64_t>& indices);

}  // namespace mmsp::train
