// Real data: one JSON object per line, tokens already expanded as the model's processor
// writes them, pixels from image files (stb_image) or pre-patchified safetensors.
// The constructor reads and checks the whole file, so every rank fails the same way
// before any collective; pixels are decoded only when a rank asks (nothing big cached).
// The format is in docs/data.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/model/config/config.h"
#include "mmsp/model/vision/pixel_geometry.h"
#include "mmsp/train/data/dataset.h"
#include "mmsp/train/data/video_file.h"

namespace mmsp::train {

class JsonlDataset : public Dataset {
 public:
  // Errors name the file and line, the field and the value; relative pixel paths are
  // relative to the directory of `path`. Image files whose header gives more than
  // `max_image_pixels` (width × height) are refused here, before any decoding.
  // A line longer than `max_line_bytes` (0: no limit) is refused before it is parsed:
  // a parsed JSON line takes ~24× its bytes (a 200 MB line of ids took 4.9 GB).
  JsonlDataset(const std::string& path, const model::ModelConfig& config, int64_t max_image_pixels = int64_t{1} << 24,
               int64_t max_line_bytes = 0);

  // The longest line a sample of `row_tokens` tokens can need: 32 bytes per token (its
  // id, its loss-mask entry, separators and spacing: ~10 in practice) and 1 MiB for
  // the pixel sources and grids.
  static int64_t line_bytes_for(int64_t row_tokens) { return 32 * row_tokens + (int64_t{1} << 20); }

  // The log-probability lists of `mmsp logprobs` over this file (read_logprobs_file) as
  // every sample's old_logprobs (`reference` false) or ref_logprobs (true; a pair's side:
  // their sum its reference). A line that gives its own is refused: one source each. Each
  // list's length is checked against the sample's labelled tokens, naming the file and line.
  void attach_logprobs(const std::string& path, bool reference, const std::string& flag);

  // Refuses the first sample longer than `row_limit` tokens (one row of a step), naming
  // its line: called with the packer's limit before the first step.
  void check_lengths(int64_t row_limit) const;

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  plan::Sequence sequence(int64_t index) const override;
  const RolloutValues* rollout(int64_t index) const override;
  at::Tensor image_pixels(int64_t index, int64_t image) const override;
  at::Tensor video_pixels(int64_t index, int64_t video) const override;
  // Decodes only the frames of the temporal groups the rows come from.
  at::Tensor video_pixel_rows(int64_t index, int64_t video, int64_t first, int64_t rows) const override;
  std::string describe() const override;

  // "file.jsonl:7" (a pair's side: "file.jsonl:7 chosen"): where sample `index` came from.
  std::string location(int64_t index) const;

  // What decoding its video files has cost so far (every thread's calls together).
  VideoDecodeCounts video_decode_counts() const;

 private:
  // One image or video: image files (one for an image, the frames of a video), or a
  // tensor of a safetensors file (paths resolved against the jsonl's directory).
  struct Source {
    std::vector<std::string> files;      // an image's file, a frame folder's frames, or a video file
    std::vector<int64_t> frame_indices;  // a video file's frames to decode (empty: not a video file)
    std::string safetensors, tensor;
    // The first file's size from its header, read again when decoding: a family's
    // grid need not record it (InternVL's tile count; PixelGeometry::frame_size).
    int64_t width = 0, height = 0;
  };
  struct Sample {
    int64_t line = 0;
    plan::Sequence sequence;
    std::vector<Source> images, videos;
    RolloutValues rollout;  // data/rollout_values.h: empty unless the line has those fields
    std::string side;       // "chosen" or "rejected": a preference pair's side (else empty)
  };

  // An image's or video's files and the first one's size (W x H).
  struct ItemFiles {
    Source source;
    int64_t width = 0, height = 0;
    int64_t frames = 0;  // the item's frames (an image: 1)
  };
  struct Line;  // the line being read (jsonl_dataset.cpp)

  // The constructor's steps, one line at a time: a sample, or a preference pair's two.
  void read_line(const std::string& text, int64_t number);
  void read_pair(const nlohmann::json& object, const std::string& where, int64_t number);  // jsonl_rl_lines.cpp
  Sample read_sample(const nlohmann::json& object, const std::string& where, int64_t number) const;
  void read_tokens(const Line& line, plan::Sequence& seq) const;
  void read_seconds(const Line& line, plan::Sequence& seq) const;
  void read_items(const Line& line, bool video, Sample& s) const;
  Source read_tensor_source(const Line& line, const nlohmann::json& item, const std::string& name,
                            const plan::Grid& grid) const;
  ItemFiles read_files(const Line& line, const nlohmann::json& item, bool video, const std::string& name) const;
  ItemFiles read_video_file(const Line& line, const nlohmann::json& item, const std::string& name) const;

  const Sample& sample(int64_t index) const;
  at::Tensor pixels(const Sample& s, const Source& source, const plan::Grid& grid, bool video, int64_t item) const;
  at::Tensor video_rows(const std::string& where, const Source& source, const plan::Grid& grid) const;

  std::string path_;
  std::string dir_;  // relative pixel paths start here
  model::ModelConfig config_;
  std::shared_ptr<const model::PixelGeometry> geometry_;  // the family's processor
  int64_t max_image_pixels_ = 0;
  std::vector<Sample> samples_;
  // video_decode_counts(): pixels are read from the prefetch thread and the step's alike.
  mutable std::atomic<int64_t> frames_decoded_{0}, seeks_{0};
};

}  // namespace mmsp::train
