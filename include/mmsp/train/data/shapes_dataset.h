// The built-in learnable dataset: each sample draws one to three images (or, for the
// Qwen families, a short video) of one coloured shape on a grey background, captioned in
// words ("a big red circle on the left", "a small blue square moves right"). Colour, shape,
// size and place are uniform and independent, so only looking lowers the caption loss.
// Sample i is a pure function of (seed, i): every rank draws the same sample.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mmsp/model/config/config.h"
#include "mmsp/model/vision/pixel_geometry.h"
#include "mmsp/train/data/dataset.h"
#include "mmsp/train/data/word_tokenizer.h"

namespace mmsp::train {

struct ShapesOptions {
  // samples per epoch
  int64_t samples = 4096;
  // every draw of sample i comes from (seed, i) alone
  uint64_t seed = 0;
  // Qwen families: image / video sides in merged tokens (patch_size · spatial_merge_size
  // pixels each), drawn per side, so sizes and aspect ratios vary; LLaVA is fixed at image_size
  int64_t min_tokens_per_side = 2, max_tokens_per_side = 6;
  // share of samples with 2 or 3 images
  double multi_image_fraction = 0.2;
  // Qwen families: share of samples that are one video of a moving shape (ignored for LLaVA)
  double video_fraction = 0.2;
  // frames per video (padded to a multiple of temporal_patch_size by the processor rule)
  int64_t min_frames = 2, max_frames = 4;
  // every pixel the per-channel mean (all zeros after normalisation): the "images
  // blanked" baseline, whose loss shows what the text alone predicts
  bool blank_images = false;
  // the longest sample (tokens; 0: unbounded): a longer draw loses its last images, or is
  // drawn small, so that it fits a step's row (the trainer passes its row's tokens)
  int64_t max_sequence_tokens = 0;
};

// What one image or video of a sample shows, in caption words.
struct ShapesItem {
  bool video = false;
  int64_t height = 0, width = 0;  // pixels
  int64_t frames = 1;
  std::string size, colour, shape;
  std::string place;            // images: left/right/top/bottom/centre; videos: the direction of motion
  std::string caption() const;  // "a big red circle on the left" / "a small blue square moves right"
};

class ShapesDataset : public Dataset {
 public:
  ShapesDataset(const ShapesOptions& options, const model::ModelConfig& config);

  int64_t size() const override { return options_.samples; }
  plan::Sequence sequence(int64_t index) const override;
  at::Tensor image_pixels(int64_t index, int64_t image) const override;
  at::Tensor video_pixels(int64_t index, int64_t video) const override;
  std::string describe() const override;

  // The items of sample `index` in order of appearance (cheap: no pixels).
  std::vector<ShapesItem> items(int64_t index) const;
  // The caption words of sample `index` ("... and ..." over its items).
  std::string caption(int64_t index) const;
  // [T, C, H, W] frames in 0..1 before patchifying (T = 1 for an image); `item` counts
  // images and videos together, in order of appearance.
  at::Tensor render(int64_t index, int64_t item) const;

  const WordTokenizer& tokenizer() const { return tokenizer_; }

 private:
  struct Draw;                                            // every random value of one item
  std::vector<Draw> draw(int64_t index) const;            // bounded by max_sequence_tokens
  std::vector<Draw> draw_unbounded(int64_t index) const;  // every draw from (seed, index)
  static std::vector<ShapesItem> items_of(const std::vector<Draw>& draws);
  static std::string caption_of(const std::vector<Draw>& draws);
  plan::Sequence sequence_of(const std::vector<Draw>& draws) const;
  at::Tensor render(const Draw& d) const;
  at::Tensor item_pixels(int64_t index, bool video, int64_t which) const;

  ShapesOptions options_;
  model::ModelConfig config_;
  WordTokenizer tokenizer_;
  std::shared_ptr<const model::PixelGeometry> geometry_;  // the family's processor
};

}  // namespace mmsp::train
