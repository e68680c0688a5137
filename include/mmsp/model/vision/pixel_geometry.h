// A family's processor geometry: how an image or video of a given size becomes the
// pixel tensor its vision tower reads and the grid the planner counts placeholder rows
// from. The data readers (train/) decode and resize files and ask this interface for
// everything else, so they never branch on the family.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mmsp/plan/sequence.h"

namespace mmsp::model {

// Per-channel normalisation x -> (x - mean[c]) / std[c] of pixels in 0..1.
struct PixelNorm {
  std::array<double, 3> mean{0.48145466, 0.4578275, 0.40821073};  // OpenAI CLIP
  std::array<double, 3> std{0.26862954, 0.26130258, 0.27577711};
};

// x normalised over dim `channel_dim` (its size at most 3), in float32.
at::Tensor normalize_pixels(const at::Tensor& x, int64_t channel_dim, const PixelNorm& norm);

// uint8 x (0..255) normalised as transformers' torchvision-backend processors (its video
// processors) do, rescale fused into the normalisation: (x - mean·255) / (std·255), the
// products taken in float32 as torch takes them: equal to normalize_pixels(x / 255) only to
// float32 rounding, so the videos' pixels use this one.
at::Tensor normalize_pixels_fused(const at::Tensor& x, int64_t channel_dim, const PixelNorm& norm);

class PixelGeometry {
 public:
  virtual ~PixelGeometry() = default;

  // Channels of a decoded frame (1 grey, 3 RGB).
  virtual int64_t channels() const = 0;
  // Whether the family reads videos (a video placeholder token exists).
  virtual bool takes_videos() const = 0;
  // The processor's normalisation.
  virtual const PixelNorm& norm() const = 0;

  // Sizes the shapes dataset may draw: a fixed square side, or (fixed_side() == 0)
  // any multiple of side_unit() on each side.
  virtual int64_t fixed_side() const = 0;
  virtual int64_t side_unit() const = 0;

  // The grid [t, h, w] (in patches) of an item of `frames` frames whose files are
  // width × height pixels, when the data gives none; throws naming the rule when the
  // size does not fit it. `what` names the item in messages.
  virtual plan::Grid grid_for(int64_t frames, int64_t width, int64_t height, const std::string& what) const = 0;
  // "" when the data's grid `g` fits item `what` of `frames` frames whose first file is
  // width × height pixels, else the reason (a phrase to follow the grid in a message:
  // "has t = 2 but image 0 has 1 frame(s), ...").
  virtual std::string grid_mismatch(const plan::Grid& g, int64_t frames, int64_t width, int64_t height,
                                    const std::string& what) const = 0;
  // The (width, height) each frame of grid `g`, whose first file is width × height
  // pixels, is decoded at. The file's size is here (and in grid_mismatch) because a grid
  // need not record it: InternVL's grid is a tile count, and its tiling starts from the
  // image at its own size (Qwen-VL and LLaVA resize to what the grid says and ignore it).
  virtual std::pair<int64_t, int64_t> frame_size(const plan::Grid& g, int64_t width, int64_t height) const = 0;
  // Placeholder tokens (= embedding rows) of an item of grid `g`.
  virtual int64_t placeholder_rows(const plan::Grid& g) const = 0;

  // Shape of one item's pixel tensor (what a dataset returns, what a safetensors
  // source must hold), and the rows it takes along dim 0 of the batch's tensor, whose
  // other dims are row_shape().
  virtual std::vector<int64_t> item_shape(const plan::Grid& g) const = 0;
  virtual int64_t batch_rows(const plan::Grid& g) const = 0;
  virtual std::vector<int64_t> row_shape() const = 0;
  // What item_shape's dims are, for messages ("patches x channels*temporal_patch_size*patch_size^2").
  virtual std::string item_layout() const = 0;

  // frames [T, C, H, W] in 0..1, each frame_size(grid) -> the item's tensor (float32).
  virtual at::Tensor item_pixels(const at::Tensor& frames) const = 0;
  // A video's frames [T, C, H, W] uint8, each frame_size(grid), resized as the video
  // processors resize (torchvision) -> the item's tensor (float32), normalised as they
  // normalise. Families without videos throw.
  virtual at::Tensor video_pixels(const at::Tensor& frames) const;
  // A video's rows in groups of frames, in order: the frames each group is made of and the
  // rows each group gives (Qwen: temporal patches of temporal_patch_size frames, h·w rows each,
  // t-major), so that rows of a video can be made from their frames alone. 0: not grouped.
  virtual int64_t video_frames_per_group() const { return 0; }
  virtual int64_t video_rows_per_group(const plan::Grid& g) const { return 0; }
};

}  // namespace mmsp::model
