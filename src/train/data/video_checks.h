// What the video decoder (video_file.cpp) refuses beyond the errors FFmpeg returns: a
// stream or frame that asks to be shown rotated or flipped (its display matrix), a frame the
// decoder says it concealed errors in, a packet the container flags corrupt; and how a
// timestamp reads in a message. Private to train/data: it speaks FFmpeg's types.
#pragma once

#include <cstdint>
#include <string>

extern "C" {
struct AVFrame;
struct AVPacket;
struct AVStream;
}

namespace mmsp::train::video {

// FFmpeg's words for an error code.
std::string av_error(int code);

// "timestamp 2048", or "no timestamp" for AV_NOPTS_VALUE.
std::string timestamp_text(int64_t t);

// Empty when the stream's frames are shown as they are stored; else, as a noun phrase for
// "file ... is <problem>", what its display matrix asks (rotated by -90 degrees, mirrored,
// scaled) and the rule: mmsp's decoder does not transform frames, torchcodec 0.17 rotates
// them, so the pixels would differ.
std::string display_problem(const AVStream& stream);

// Empty for a frame the decoder gave whole; else what it said of the frame: errors it
// concealed (decode_error_flags), the corrupt flag, a display matrix of the frame's own.
std::string frame_problem(const AVFrame& frame);

// Empty unless the container flags the packet corrupt (AV_PKT_FLAG_CORRUPT).
std::string packet_problem(const AVPacket& packet);

}  // namespace mmsp::train::video
