// A training dataset as the trainer sees it: a fixed number of samples per epoch, each
// with cheap token metadata (what the step planner reads, asked for by every rank) and
// expensive pixels (asked for only by the rank that encodes that image or video).
// Which samples form a step is step_packer's business; batching pixels is step_pixels'.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "mmsp/plan/sequence.h"
#include "mmsp/train/data/rollout_values.h"

namespace mmsp::train {

class Dataset {
 public:
  virtual ~Dataset() = default;

  // Samples per epoch; indices are 0 .. size() - 1.
  virtual int64_t size() const = 0;

  // Tokens and grids of one sample, as a processor writes them (placeholders expanded,
  // loss_mask 1 on the tokens to learn). Cheap: every rank asks for every sample of a step.
  virtual plan::Sequence sequence(int64_t index) const = 0;

  // Pixels of image `image` (order of appearance) of sample `index`, float32 on the CPU,
  // of the family's model::PixelGeometry::item_shape(grid): Qwen-VL [t·h·w, C·tp·p·p]
  // rows of the grid in the processor's order (qwen_patches.h); LLaVA [C, S, S].
  // Expensive: only the rank that encodes the image asks.
  virtual at::Tensor image_pixels(int64_t index, int64_t image) const = 0;

  // Pixels of video `video` of sample `index`: Qwen-VL [t·h·w, C·tp·p·p].
  virtual at::Tensor video_pixels(int64_t index, int64_t video) const = 0;
  // Rows [first, first + rows) of them: what a rank holds of a video split over its context
  // group (--vision-split). A dataset that can decode only the frames those rows come from
  // overrides this; by default the whole video, cut.
  virtual at::Tensor video_pixel_rows(int64_t index, int64_t video, int64_t first, int64_t rows) const {
    return video_pixels(index, video).narrow(0, first, rows);
  }

  // Sample `index`'s rollout numbers (advantages, old and reference log-probabilities: RL
  // objectives); null where the dataset has none for it.
  virtual const RolloutValues* rollout(int64_t /*index*/) const { return nullptr; }

  // One line for logs: kind, source, sample count.
  virtual std::string describe() const = 0;
};

}  // namespace mmsp::train
