// Filling the batch's pixel tensors item by item, only where this rank encodes.
#include "mmsp/train/step_pixels.h"

#include "mmsp/core/check.h"

namespace mmsp::train {

namespace {

std::string grid_text(const plan::Grid& g) {
  return detail::concat("[", g[0], ", ", g[1], ", ", g[2], "]");
}

}  // namespace

model::PixelInputs load_pixels(const Dataset& dataset, const std::vector<int64_t>& samples,
                               const plan::Batch& batch, const model::ModelConfig& config,
                               const PixelsNeeded& needed, at::ScalarType dtype) {
  MMSP_CHECK(samples.size() == batch.sequences.size(), "load_pixels: ", samples.size(),
             " samples but the batch has ", batch.sequences.size(), " sequences");
  const bool qwen = config.family != plan::ModelFamily::llava && config.family != plan::ModelFamily::internvl;
  model::PixelInputs out;
  if (config.family == plan::ModelFamily::internvl) {  // InternVL: an image's tiles [t, C, S, S]
    const model::InternVisionConfig& v = *config.intern_vision;
    int64_t tiles = 0;
    for (const plan::Sequence& s : batch.sequences) {
      MMSP_CHECK(s.video_grid_thw.empty(), "load_pixels: ", config.model_type, " takes no videos");
      for (const plan::Grid& g : s.image_grid_thw) tiles += g[0];
    }
    out.images = at::zeros({tiles, v.num_channels, v.image_size, v.image_size}, at::kFloat);
    int64_t item = 0, offset = 0;
    for (size_t b = 0; b < samples.size(); ++b) {
      const auto& grids = batch.sequences[b].image_grid_thw;
      for (size_t k = 0; k < grids.size(); ++k, ++item) {
        const int64_t t = grids[k][0];
        if (needed(plan::VisionKind::image, item)) {
          const at::Tensor px = dataset.image_pixels(samples[b], static_cast<int64_t>(k));
          at::Tensor slot = out.images.narrow(0, offset, t);
          MMSP_CHECK(px.sizes() == slot.sizes(), "load_pixels: sample ", samples[b], " image ", k, " has pixels ",
                     px.sizes(), " but grid ", grid_text(grids[k]), " takes ", slot.sizes(), " tiles");
          slot.copy_(px);
        }
        offset += t;
      }
    }
    out.images = out.images.to(dtype);
    return out;
  }
  if (!qwen) {  // LLaVA: one [C, S, S] image per grid
    const model::ClipVisionConfig& v = *config.clip_vision;
    int64_t images = 0;
    for (const plan::Sequence& s : batch.sequences) {
      MMSP_CHECK(s.video_grid_thw.empty(), "load_pixels: ", config.model_type, " takes no videos");
      images += static_cast<int64_t>(s.image_grid_thw.size());
    }
    out.images = at::zeros({images, v.num_channels, v.image_size, v.image_size}, at::kFloat);
    int64_t item = 0;
    for (size_t b = 0; b < samples.size(); ++b) {
      for (size_t k = 0; k < batch.sequences[b].image_grid_thw.size(); ++k, ++item) {
        if (!needed(plan::VisionKind::image, item)) continue;
        const at::Tensor px = dataset.image_pixels(samples[b], static_cast<int64_t>(k));
        MMSP_CHECK(px.sizes() == out.images[item].sizes(), "load_pixels: sample ", samples[b], " image ", k,
                   " has pixels ", px.sizes(), " but the model takes ", out.images[item].sizes());
        out.images[item].copy_(px);
      }
    }
    out.images = out.images.to(dtype);
    return out;
  }
  const model::QwenVisionConfig& v = *config.qwen_vision;
  const int64_t width = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
  for (const plan::VisionKind kind : {plan::VisionKind::image, plan::VisionKind::video}) {
    const bool video = kind == plan::VisionKind::video;
    int64_t rows = 0;
    for (const plan::Sequence& s : batch.sequences)
      for (const plan::Grid& g : video ? s.video_grid_thw : s.image_grid_thw) rows += g[0] * g[1] * g[2];
    at::Tensor all = at::zeros({rows, width}, at::kFloat);  // [Σ patches, C·tp·p·p]
    int64_t item = 0, offset = 0;
    for (size_t b = 0; b < samples.size(); ++b) {
      const auto& grids = video ? batch.sequences[b].video_grid_thw : batch.sequences[b].image_grid_thw;
      for (size_t k = 0; k < grids.size(); ++k, ++item) {
        const plan::Grid& g = grids[k];
        const int64_t patches = g[0] * g[1] * g[2];
        if (needed(kind, item)) {
          const at::Tensor px = video ? dataset.video_pixels(samples[b], static_cast<int64_t>(k))
                                      : dataset.image_pixels(samples[b], static_cast<int64_t>(k));
          MMSP_CHECK(px.dim() == 2 && px.size(0) == patches && px.size(1) == width, "load_pixels: sample ",
                     samples[b], " ", plan::to_string(kind), " ", k, " has pixels ", px.sizes(), " but grid ",
                     grid_text(g), " needs [", patches, ", ", width, "]");
          all.narrow(0, offset, patches).copy_(px);
        }
        offset += patches;
      }
    }
    (video ? out.videos : out.images) = all.to(dtype);
  }
  return out;
}

}  // namespace mmsp::train
