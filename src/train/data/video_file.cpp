// Video files through FFmpeg, converted to RGB as torchcodec converts them; see video_file.h.
#include "mmsp/train/data/video_file.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavfilter/avfilter.h>
#include <libavfilter/buffersink.h>
#include <libavfilter/buffersrc.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "data/video_checks.h"
#include "mmsp/core/check.h"

namespace mmsp::train {

namespace {

using video::av_error;
using video::timestamp_text;

// What follows an error that shows the file's data is damaged (or not what its header says).
const char* const kDamaged =
    ": the file is damaged (FFmpeg would conceal it and train on wrong pixels; torchcodec "
    "refuses what its decoder refuses): replace it with a good copy";

struct InputCloser {
  void operator()(AVFormatContext* c) const { avformat_close_input(&c); }
};
struct CodecFreer {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFreer {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFreer {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct GraphFreer {
  void operator()(AVFilterGraph* g) const { avfilter_graph_free(&g); }
};
struct SwsFreer {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
using Input = std::unique_ptr<AVFormatContext, InputCloser>;
using Codec = std::unique_ptr<AVCodecContext, CodecFreer>;
using Frame = std::unique_ptr<AVFrame, FrameFreer>;
using Packet = std::unique_ptr<AVPacket, PacketFreer>;

// The file opened and its best video stream found; `problem` says why not.
struct OpenedVideo {
  Input input;
  int stream = -1;
  const AVCodec* decoder = nullptr;
  std::string problem;
};

OpenedVideo open_video(const std::filesystem::path& file) {
  OpenedVideo v;
  AVFormatContext* raw = nullptr;
  int ret = avformat_open_input(&raw, file.c_str(), nullptr, nullptr);
  if (ret < 0) {
    v.problem = detail::concat("not a video FFmpeg can open (", av_error(ret), ")");
    return v;
  }
  v.input.reset(raw);
  ret = avformat_find_stream_info(raw, nullptr);
  if (ret < 0) {
    v.problem = detail::concat("a file whose streams FFmpeg cannot read (", av_error(ret), ")");
    return v;
  }
  ret = av_find_best_stream(raw, AVMEDIA_TYPE_VIDEO, -1, -1, &v.decoder, 0);
  if (ret == AVERROR_STREAM_NOT_FOUND) {
    v.problem = "a file with no video stream";
  } else if (ret == AVERROR_DECODER_NOT_FOUND || !v.decoder) {
    const AVCodecDescriptor* d = avcodec_descriptor_get(raw->streams[std::max(ret, 0)]->codecpar->codec_id);
    v.problem = detail::concat("a video in a codec this FFmpeg cannot decode (", d ? d->name : "unknown", ")");
  } else if (ret < 0) {
    v.problem = detail::concat("a file FFmpeg finds no video stream in (", av_error(ret), ")");
  } else {
    v.stream = ret;
    v.problem = video::display_problem(*raw->streams[ret]);
  }
  return v;
}

// torchcodec's conversion of one decoded frame to RGB24: swscale when the width is a
// multiple of 32 (no scaler flags, the frame's colour matrix on both sides), a filter graph
// otherwise (its automatic scale filter converts, with the graph's defaults).
class RgbConverter {
 public:
  explicit RgbConverter(AVRational time_base) : time_base_(time_base) {}

  at::Tensor convert(const AVFrame& f, const std::string& where) {
    at::Tensor out = at::empty({f.height, f.width, 3}, at::kByte);
    if (f.width % 32 == 0) {
      swscale(f, out, where);
    } else {
      filter(f, out, where);
    }
    return out;
  }

 private:
  void swscale(const AVFrame& f, at::Tensor& out, const std::string& where) {
    if (!sws_ || sws_key_ != std::make_tuple(f.width, f.height, f.format, static_cast<int>(f.colorspace))) {
      sws_.reset(sws_getContext(f.width, f.height, static_cast<AVPixelFormat>(f.format), f.width, f.height,
                                AV_PIX_FMT_RGB24, 0, nullptr, nullptr, nullptr));
      MMSP_CHECK(sws_ != nullptr, where, ": libswscale cannot convert pixel format ",
                 av_get_pix_fmt_name(static_cast<AVPixelFormat>(f.format)), " to RGB");
      int *inv_table = nullptr, *table = nullptr;
      int src_range = 0, dst_range = 0, brightness = 0, contrast = 0, saturation = 0;
      MMSP_CHECK(sws_getColorspaceDetails(sws_.get(), &inv_table, &src_range, &table, &dst_range, &brightness,
                                          &contrast, &saturation) != -1,
                 where, ": sws_getColorspaceDetails failed");
      const int* coefficients = sws_getCoefficients(f.colorspace);
      MMSP_CHECK(sws_setColorspaceDetails(sws_.get(), coefficients, src_range, coefficients, dst_range, brightness,
                                          contrast, saturation) != -1,
                 where, ": sws_setColorspaceDetails failed");
      sws_key_ = std::make_tuple(f.width, f.height, f.format, static_cast<int>(f.colorspace));
    }
    uint8_t* planes[4] = {out.data_ptr<uint8_t>(), nullptr, nullptr, nullptr};
    int strides[4] = {static_cast<int>(f.width * 3), 0, 0, 0};
    const int rows = sws_scale(sws_.get(), f.data, f.linesize, 0, f.height, planes, strides);
    MMSP_CHECK(rows == f.height, where, ": libswscale converted ", rows, " rows of ", f.height);
  }

  void filter(const AVFrame& f, at::Tensor& out, const std::string& where) {
    const auto key = std::make_tuple(f.width, f.height, f.format, 0);
    if (!graph_ || graph_key_ != key) make_graph(f, where);
    int ret = av_buffersrc_write_frame(source_, &f);
    MMSP_CHECK(ret >= 0, where, ": the RGB filter graph refused a frame (", av_error(ret), ")");
    Frame rgb(av_frame_alloc());
    ret = av_buffersink_get_frame(sink_, rgb.get());
    MMSP_CHECK(ret >= 0, where, ": the RGB filter graph gave no frame (", av_error(ret), ")");
    MMSP_CHECK(rgb->format == AV_PIX_FMT_RGB24 && rgb->width == f.width && rgb->height == f.height, where,
               ": the RGB filter graph gave a ", rgb->width, " x ", rgb->height, " frame");
    const at::Tensor rows = at::from_blob(rgb->data[0], {f.height, f.width, 3}, {rgb->linesize[0], 3, 1}, at::kByte);
    out.copy_(rows);
  }

  void make_graph(const AVFrame& f, const std::string& where) {
    graph_.reset(avfilter_graph_alloc());
    MMSP_CHECK(graph_ != nullptr, where, ": cannot allocate a filter graph");
    source_ = avfilter_graph_alloc_filter(graph_.get(), avfilter_get_by_name("buffer"), "in");
    MMSP_CHECK(source_ != nullptr, where, ": cannot allocate the filter graph's source");
    AVBufferSrcParameters* params = av_buffersrc_parameters_alloc();
    MMSP_CHECK(params != nullptr, where, ": cannot allocate the filter graph's source parameters");
    params->format = f.format;
    params->width = f.width;
    params->height = f.height;
    params->sample_aspect_ratio = f.sample_aspect_ratio;
    params->time_base = time_base_;
    int ret = av_buffersrc_parameters_set(source_, params);
    av_free(params);
    MMSP_CHECK(ret >= 0, where, ": the filter graph's source: ", av_error(ret));
    ret = avfilter_init_str(source_, nullptr);
    MMSP_CHECK(ret >= 0, where, ": the filter graph's source: ", av_error(ret));
    sink_ = avfilter_graph_alloc_filter(graph_.get(), avfilter_get_by_name("buffersink"), "out");
    MMSP_CHECK(sink_ != nullptr, where, ": cannot allocate the filter graph's sink");
    const AVPixelFormat formats[] = {AV_PIX_FMT_RGB24, AV_PIX_FMT_NONE};
    ret = av_opt_set_int_list(sink_, "pix_fmts", formats, AV_PIX_FMT_NONE, AV_OPT_SEARCH_CHILDREN);
    MMSP_CHECK(ret >= 0, where, ": the filter graph's sink: ", av_error(ret));
    ret = avfilter_init_str(sink_, nullptr);
    MMSP_CHECK(ret >= 0, where, ": the filter graph's sink: ", av_error(ret));
    AVFilterInOut* outputs = avfilter_inout_alloc();
    AVFilterInOut* inputs = avfilter_inout_alloc();
    outputs->name = av_strdup("in");
    outputs->filter_ctx = source_;
    inputs->name = av_strdup("out");
    inputs->filter_ctx = sink_;
    ret = avfilter_graph_parse_ptr(graph_.get(), "copy", &inputs, &outputs, nullptr);
    avfilter_inout_free(&inputs);
    avfilter_inout_free(&outputs);
    MMSP_CHECK(ret >= 0, where, ": the filter graph: ", av_error(ret));
    ret = avfilter_graph_config(graph_.get(), nullptr);
    MMSP_CHECK(ret >= 0, where, ": the filter graph: ", av_error(ret));
    graph_key_ = std::make_tuple(f.width, f.height, f.format, 0);
  }

  AVRational time_base_;
  std::unique_ptr<SwsContext, SwsFreer> sws_;
  std::tuple<int, int, int, int> sws_key_{-1, -1, -1, -1};
  std::unique_ptr<AVFilterGraph, GraphFreer> graph_;
  std::tuple<int, int, int, int> graph_key_{-1, -1, -1, -1};
  AVFilterContext* source_ = nullptr;
  AVFilterContext* sink_ = nullptr;
};

// A frame's timestamp as torchcodec reads it: its pts, its packet's dts where it has none.
int64_t pts_or_dts(const AVFrame& f) { return f.pts == AV_NOPTS_VALUE ? f.pkt_dts : f.pts; }

// The stream's frames as torchcodec's exact seek mode numbers them, from one pass over its
// packets that decodes nothing: frame i is the packet with the i-th smallest timestamp (pts,
// dts where a packet has none), and the key frames' timestamps are where a decode can start.
struct FrameTimes {
  std::vector<int64_t> pts;      // ascending: frame i's timestamp
  std::vector<int64_t> key_pts;  // ascending
  // Every frame has a timestamp of its own: frames can be found by it after a seek.
  bool seekable() const {
    if (pts.empty() || pts.front() == AV_NOPTS_VALUE) return false;
    return std::adjacent_find(pts.begin(), pts.end()) == pts.end();
  }
  // Index into key_pts of the last key frame at or before `t`; -1 when none is.
  int64_t key_before(int64_t t) const {
    return static_cast<int64_t>(std::upper_bound(key_pts.begin(), key_pts.end(), t) - key_pts.begin()) - 1;
  }
};

FrameTimes scan_frame_times(AVFormatContext* input, int stream, const std::string& where) {
  FrameTimes times;
  Packet packet(av_packet_alloc());
  MMSP_CHECK(packet != nullptr, where, ": cannot allocate a packet");
  while (true) {
    const int ret = av_read_frame(input, packet.get());
    if (ret == AVERROR_EOF) break;
    MMSP_CHECK(ret >= 0, where, ": reading its packets: ", av_error(ret));
    if (packet->stream_index == stream && !(packet->flags & AV_PKT_FLAG_DISCARD)) {
      const int64_t t = packet->pts == AV_NOPTS_VALUE ? packet->dts : packet->pts;
      times.pts.push_back(t);
      if (packet->flags & AV_PKT_FLAG_KEY) times.key_pts.push_back(t);
    }
    av_packet_unref(packet.get());
  }
  std::sort(times.pts.begin(), times.pts.end());
  std::sort(times.key_pts.begin(), times.key_pts.end());
  return times;
}

// The stream's decoder, fed packet by packet: the next frame it gives, from wherever the
// file was last sought. Every error the decoder returns is refused, as torchcodec refuses it
// (FFmpeg's concealment would otherwise hand on a damaged frame, or none), and so is a frame
// on the way to the one asked that the decoder says it concealed errors in (stricter than
// torchcodec, which takes such a frame): each error names the frame asked.
class FrameReader {
 public:
  FrameReader(AVFormatContext* input, int stream, AVCodecContext* codec, const std::string& where,
              VideoDecodeCounts& counts)
      : input_(input),
        stream_(stream),
        codec_(codec),
        where_(where),
        counts_(counts),
        packet_(av_packet_alloc()),
        frame_(av_frame_alloc()),
        width_(input->streams[stream]->codecpar->width),
        height_(input->streams[stream]->codecpar->height) {
    MMSP_CHECK(packet_ != nullptr && frame_ != nullptr, where, ": cannot allocate a packet and a frame");
  }

  // The frame the caller is after: frame `index` at timestamp `t` (AV_NOPTS_VALUE: none).
  void aim(int64_t index, int64_t t) {
    target_ = t == AV_NOPTS_VALUE ? detail::concat("frame ", index)
                                  : detail::concat("frame ", index, " (", timestamp_text(t), ")");
    target_t_ = t;
  }

  // Starts decoding again at `t` (a key frame's timestamp), as torchcodec seeks: the
  // container's seek to at most `t`, the decoder flushed. Frames before `t` that the decoder
  // still gives (an open group's leading frames, whose references precede the key frame)
  // are not checked: nothing asked is decoded from them.
  void seek(int64_t t) {
    const int ret = avformat_seek_file(input_, stream_, INT64_MIN, t, t, 0);
    MMSP_CHECK(ret >= 0, where_, ": seeking to ", timestamp_text(t), ": ", av_error(ret));
    avcodec_flush_buffers(codec_);
    draining_ = false;
    checked_from_ = t;
    ++counts_.seeks;
  }

  // The next decoded frame, or nullptr at the end of the stream. Every frame has the size the
  // stream's header gives (the size its grid was made from when the data was read).
  const AVFrame* next() {
    av_frame_unref(frame_.get());
    while (true) {
      const int got = avcodec_receive_frame(codec_, frame_.get());
      if (got >= 0) break;
      if (got == AVERROR_EOF) return nullptr;
      if (got != AVERROR(EAGAIN))
        refuse(detail::concat("the ", codec_->codec->name, " decoder failed (", av_error(got), ")", kDamaged));
      MMSP_CHECK(!draining_, where_, ": the decoder asks for packets after the end of the file");
      feed();
    }
    ++counts_.frames_decoded;
    const int64_t t = pts_or_dts(*frame_);
    if (t == AV_NOPTS_VALUE || t >= checked_from_) {
      const std::string problem = video::frame_problem(*frame_);
      if (!problem.empty())
        refuse(detail::concat(t == target_t_
                                  ? std::string("the frame itself: ")
                                  : detail::concat("its frame (", timestamp_text(t), "), decoded on the way: "),
                              problem));
    }
    if (frame_->width != width_ || frame_->height != height_)
      refuse(detail::concat("its frame (", timestamp_text(t), ") is ", frame_->width, " x ", frame_->height,
                            " but the stream's header says ", width_, " x ", height_,
                            "; a video's frames must all have the size of its header"));
    return frame_.get();
  }

  // Ends with the frame asked and the reason it cannot be had.
  [[noreturn]] void refuse(const std::string& why) const {
    MMSP_FAIL(where_, ": ", target_, " cannot be decoded: ", why);
  }

 private:
  // Sends the stream's next packet to the decoder, or at the end of the file the end.
  void feed() {
    while (true) {
      const int ret = av_read_frame(input_, packet_.get());
      if (ret == AVERROR_EOF) {
        const int sent = avcodec_send_packet(codec_, nullptr);
        // The frames the decoder held back (reordering) come out now, and with them an error
        // it met: torchcodec's "Could not flush decoder".
        if (sent < 0 && sent != AVERROR_EOF)
          refuse(detail::concat("the ", codec_->codec->name, " decoder failed at the end of the stream (",
                                av_error(sent), ")", kDamaged));
        draining_ = true;
        return;
      }
      if (ret < 0) refuse(detail::concat("reading a packet failed (", av_error(ret), ")", kDamaged));
      if (packet_->stream_index != stream_) {
        av_packet_unref(packet_.get());
        continue;
      }
      const int64_t t = packet_->pts == AV_NOPTS_VALUE ? packet_->dts : packet_->pts;
      const std::string problem = video::packet_problem(*packet_);
      if (!problem.empty()) refuse(detail::concat("its packet at ", timestamp_text(t), ": ", problem, kDamaged));
      const int sent = avcodec_send_packet(codec_, packet_.get());
      av_packet_unref(packet_.get());
      if (sent < 0)
        refuse(detail::concat("the ", codec_->codec->name, " decoder refused the packet at ", timestamp_text(t), " (",
                              av_error(sent), ")", kDamaged));
      return;
    }
  }

  AVFormatContext* input_;
  int stream_;
  AVCodecContext* codec_;
  const std::string& where_;
  VideoDecodeCounts& counts_;
  Packet packet_;
  Frame frame_;
  bool draining_ = false;
  int width_, height_;  // the stream's, from its header
  std::string target_ = "a frame";
  int64_t target_t_ = AV_NOPTS_VALUE;
  int64_t checked_from_ = INT64_MIN;  // frames from this timestamp on are checked
};

// The stream's decoder, opened as torchcodec opens it.
Codec open_decoder(const OpenedVideo& v, const std::string& where) {
  Codec codec(avcodec_alloc_context3(v.decoder));
  MMSP_CHECK(codec != nullptr, where, ": cannot allocate a decoder");
  int ret = avcodec_parameters_to_context(codec.get(), v.input->streams[v.stream]->codecpar);
  MMSP_CHECK(ret >= 0, where, ": decoder parameters: ", av_error(ret));
  // Threads within a frame only (FFmpeg's count): the frames are the same with any threading
  // (torchcodec's default is one thread, transformers' read_video_torchcodec takes FFmpeg's
  // choice), but with frame threads a damaged packet's error comes back packets later, or not
  // at all when the decode stops first, and a concealed frame's decode_error_flags are set
  // after it is handed out, or not: measured, the same damaged file was refused in 2 runs of
  // 3. Within a frame, each error and flag belongs to the packet and the frame it came from.
  codec->thread_count = 0;
  codec->thread_type = FF_THREAD_SLICE;
  ret = avcodec_open2(codec.get(), v.decoder, nullptr);
  MMSP_CHECK(ret >= 0, where, ": cannot open the ", v.decoder->name, " decoder: ", av_error(ret));
  return codec;
}

// As torchcodec's get_frames_at: the frames in ascending order, each the first decoded at or
// after its timestamp; a seek to the key frame before it unless the last frame given and it
// share their key frame (then decoding on is shorter). So a frame far into a file, or a share
// of a split video, costs its own group of pictures, not the frames before it.
template <typename Take>
void decode_seeking(FrameReader& reader, const FrameTimes& times, const std::map<int64_t, std::vector<size_t>>& wanted,
                    Take take) {
  int64_t given = AV_NOPTS_VALUE;  // the timestamp of the last frame given
  for (const auto& entry : wanted) {
    const int64_t index = entry.first;
    const int64_t t = times.pts[index];
    const int64_t key = times.key_before(t);
    const bool decode_on = given != AV_NOPTS_VALUE && t > given && key >= 0 && key == times.key_before(given);
    reader.aim(index, t);
    if (!decode_on) reader.seek(times.key_pts.empty() ? t : times.key_pts[std::max<int64_t>(key, 0)]);
    const AVFrame* f = nullptr;
    while ((f = reader.next()) != nullptr && pts_or_dts(*f) < t) {}
    if (f == nullptr) reader.refuse("the decoder ended before it");
    // A packet (or frame) the decoder dropped gives the next frame in its place: taken, it
    // would shift every frame after it.
    if (f->pts != AV_NOPTS_VALUE && f->pts != t)
      reader.refuse(detail::concat("the decoder gave the frame (", timestamp_text(f->pts), ") in its place", kDamaged));
    given = pts_or_dts(*f);
    take(*f, index);
  }
}

}  // namespace

VideoFileHeader read_video_header(const std::filesystem::path& file) {
  VideoFileHeader h;
  OpenedVideo v = open_video(file);
  if (!v.problem.empty()) {
    h.problem = v.problem;
    return h;
  }
  const AVStream* s = v.input->streams[v.stream];
  h.width = s->codecpar->width;
  h.height = s->codecpar->height;
  h.frames = s->nb_frames > 0 ? s->nb_frames : -1;
  h.codec = v.decoder->name;
  if (h.width <= 0 || h.height <= 0)
    h.problem = detail::concat("a video stream of no size (", h.width, " x ", h.height, ")");
  return h;
}

at::Tensor decode_video_frames(const std::filesystem::path& file, const std::vector<int64_t>& indices,
                               VideoDecodeCounts* counts) {
  const std::string where = detail::concat("video file \"", file.string(), "\"");
  MMSP_CHECK(!indices.empty(), where, ": no frame indices to decode");
  for (const int64_t i : indices) MMSP_CHECK(i >= 0, where, ": frame index ", i, " is negative");
  OpenedVideo v = open_video(file);
  MMSP_CHECK(v.problem.empty(), where, " is ", v.problem);
  AVStream* stream = v.input->streams[v.stream];
  Codec codec = open_decoder(v, where);

  // Each wanted frame's places in the output (indices may repeat or come in any order).
  std::map<int64_t, std::vector<size_t>> wanted;
  for (size_t k = 0; k < indices.size(); ++k) wanted[indices[k]].push_back(k);
  const int64_t last = wanted.rbegin()->first;
  FrameTimes times;
  {  // on a file of its own, so that `v` stays at the start
    OpenedVideo scan = open_video(file);
    MMSP_CHECK(scan.problem.empty(), where, " is ", scan.problem);
    times = scan_frame_times(scan.input.get(), scan.stream, where);
  }
  const int64_t frames = static_cast<int64_t>(times.pts.size());
  MMSP_CHECK(last < frames, where, " has ", frames, " frames, so frame index ", last, " is past its end");

  std::vector<at::Tensor> out(indices.size());
  RgbConverter rgb(stream->time_base);
  VideoDecodeCounts local;
  FrameReader reader(v.input.get(), v.stream, codec.get(), where, counts ? *counts : local);
  auto take = [&](const AVFrame& f, int64_t index) {
    const at::Tensor pixels = rgb.convert(f, where);
    for (const size_t k : wanted.at(index)) out[k] = pixels;
  };
  if (times.seekable()) {
    decode_seeking(reader, times, wanted, take);
  } else {
    // Frames without timestamps of their own cannot be found after a seek: decode from the
    // start, frame i the i-th the decoder gives (presentation order).
    for (int64_t next = 0; next <= last; ++next) {
      reader.aim(next, AV_NOPTS_VALUE);
      const AVFrame* f = reader.next();
      MMSP_CHECK(f != nullptr, where, " has ", next, " frames, so frame index ", last, " is past its end");
      if (wanted.count(next)) take(*f, next);
    }
  }
  return at::stack(out);
}

}  // namespace mmsp::train
