// Video files read as transformers' video processors read them: torchcodec's
// `VideoDecoder(path).get_frames_at(indices)` (what transformers 5.17's fetch_videos calls),
// frame for frame, value for value.
//
// Both decode with FFmpeg's libraries (Debian's libavformat/libavcodec) and convert each
// frame to RGB24 as torchcodec 0.17 does on the CPU: libswscale with no scaler flags and the
// frame's colour matrix when the width is a multiple of 32, else a filter graph
// (buffer -> copy -> buffersink of rgb24), whose automatic scale filter does the conversion.
// Frame i is the stream's packet with the i-th smallest timestamp, which is how torchcodec
// numbers frames in its exact seek mode, and frames are found as it finds them: a seek to the
// key frame before each, then decoding on to it. tests/hf/test_video_pixels.py compares them
// with torchcodec's.
//
// What torchcodec refuses is refused, and more: every error the decoder returns (a damaged
// packet: torchcodec's "Invalid data found when processing input"), a frame on the way to one
// asked that the decoder concealed errors in (decode_error_flags, AV_FRAME_FLAG_CORRUPT),
// which torchcodec hands on, a packet the container flags corrupt, a frame that does not come
// out where asked (a packet dropped), a frame of another size than the header's, and a stream
// or frame that asks to be shown rotated or flipped (torchcodec 0.17 rotates it; mmsp does
// not transform frames). Each names the frame asked (video_checks.h).
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

// What a decode cost: frames the decoder gave (the ones asked for and those decoded on the
// way to them) and seeks, added to by each call given it.
struct VideoDecodeCounts {
  int64_t frames_decoded = 0;
  int64_t seeks = 0;
};

// Frames `indices` (any order, repeats allowed) as [N, H, W, 3] uint8 RGB, in the order
// asked. Reads the file's packets once to number its frames, then decodes from the key frame
// before each frame asked (decoding on instead where that is shorter, as torchcodec does); a
// stream whose frames lack timestamps of their own is decoded from its start. Throws Error
// naming the file and the rule: no video stream, a frame index past the stream's end (naming
// its frame count), a display matrix; and naming the frame asked: a frame of another size
// than the header's, an error or concealment of the decoder, a frame that did not come out.
at::Tensor decode_video_frames(const std::filesystem::path& file, const std::vector<int64_t>& indices,
                               VideoDecodeCounts* counts = nullptr);

}  // namespace mmsp::train
