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

#include "mmsp/core/check.h"

namespace mmsp::train {

namespace {

std::string av_error(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, text, sizeof(text));
  return text;
}

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
  if (h.width <= 0 || h.height <= 0) h.problem = detail::concat("a video stream of no size (", h.width, " x ", h.height, ")");
  return h;
}

at::Tensor decode_video_frames(const std::filesystem::path& file, const std::vector<int64_t>& indices) {
  const std::string where = detail::concat("video file \"", file.string(), "\"");
  MMSP_CHECK(!indices.empty(), where, ": no frame indices to decode");
  for (const int64_t i : indices) MMSP_CHECK(i >= 0, where, ": frame index ", i, " is negative");
  OpenedVideo v = open_video(file);
  MMSP_CHECK(v.problem.empty(), where, " is ", v.problem);
  AVStream* stream = v.input->streams[v.stream];
  Codec codec(avcodec_alloc_context3(v.decoder));
  MMSP_CHECK(codec != nullptr, where, ": cannot allocate a decoder");
  int ret = avcodec_parameters_to_context(codec.get(), stream->codecpar);
  MMSP_CHECK(ret >= 0, where, ": decoder parameters: ", av_error(ret));
  codec->thread_count = 0;  // FFmpeg's choice, as torchcodec's default (the frames do not depend on it)
  ret = avcodec_open2(codec.get(), v.decoder, nullptr);
  MMSP_CHECK(ret >= 0, where, ": cannot open the ", v.decoder->name, " decoder: ", av_error(ret));

  // Each wanted frame's places in the output (indices may repeat or come in any order).
  std::map<int64_t, std::vector<size_t>> wanted;
  for (size_t k = 0; k < indices.size(); ++k) wanted[indices[k]].push_back(k);
  const int64_t last = wanted.rbegin()->first;
  std::vector<at::Tensor> out(indices.size());
  RgbConverter rgb(stream->time_base);
  Packet packet(av_packet_alloc());
  Frame frame(av_frame_alloc());
  int64_t next = 0;  // the index of the next frame the decoder gives
  int64_t width = -1, height = -1;
  auto take_frames = [&]() {
    while (next <= last) {
      const int got = avcodec_receive_frame(codec.get(), frame.get());
      if (got == AVERROR(EAGAIN) || got == AVERROR_EOF) return;
      MMSP_CHECK(got >= 0, where, ": decoding frame ", next, ": ", av_error(got));
      if (width < 0) width = frame->width, height = frame->height;
      MMSP_CHECK(frame->width == width && frame->height == height, where, ": frame ", next, " is ", frame->width,
                 " x ", frame->height, " but frame 0 is ", width, " x ", height,
                 "; a video's frames must have one size");
      if (const auto it = wanted.find(next); it != wanted.end()) {
        const at::Tensor pixels = rgb.convert(*frame, where);
        for (const size_t k : it->second) out[k] = pixels;
      }
      av_frame_unref(frame.get());
      ++next;
    }
  };
  while (next <= last) {
    ret = av_read_frame(v.input.get(), packet.get());
    if (ret == AVERROR_EOF) break;
    MMSP_CHECK(ret >= 0, where, ": reading frame ", next, ": ", av_error(ret));
    if (packet->stream_index == v.stream) {
      ret = avcodec_send_packet(codec.get(), packet.get());
      av_packet_unref(packet.get());
      MMSP_CHECK(ret >= 0 || ret == AVERROR_INVALIDDATA, where, ": decoding near frame ", next, ": ", av_error(ret));
      take_frames();
    } else {
      av_packet_unref(packet.get());
    }
  }
  if (next <= last) {  // the end of the file: the decoder's delayed frames
    avcodec_send_packet(codec.get(), nullptr);
    take_frames();
  }
  MMSP_CHECK(next > last, where, " has ", next, " frames, so frame index ", last, " is past its end");
  return at::stack(out);
}

}  // namespace mmsp::train
