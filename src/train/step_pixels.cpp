// Filling this rank's pixel tensors item by item, only the items it encodes.
#include "mmsp/train/step_pixels.h"

#include <algorithm>
#include <utility>

#include "mmsp/core/check.h"

namespace mmsp::train {

namespace {

std::string grid_text(const plan::Grid& g) {
  return detail::concat("[", g[0], ", ", g[1], ", ", g[2], "]");
}

}  // namespace

PixelsNeeded pixels_encoded_here(const plan::StepPlan& plan, model::VisionMode mode) {
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  std::vector<std::pair<plan::VisionKind, int64_t>> wanted;
  if (mode == model::VisionMode::replicate) {
    for (const auto& item : items) wanted.emplace_back(item.kind, item.batch_index);
  } else {
    for (int64_t i : plan.mine.routes.encoder_items) wanted.emplace_back(items.at(i).kind, items.at(i).batch_index);
  }
  std::sort(wanted.begin(), wanted.end());
  return [wanted = std::move(wanted)](plan::VisionKind kind, int64_t item) {
    return std::binary_search(wanted.begin(), wanted.end(), std::make_pair(kind, item));
  };
}

model::PixelInputs load_pixels(const Dataset& dataset, const std::vector<int64_t>& samples,
                               const plan::Batch& batch, const model::ModelConfig& config,
                               const PixelsNeeded& needed, at::ScalarType dtype) {
  MMSP_CHECK(samples.size() == batch.sequences.size(), "load_pixels: ", samples.size(),
             " samples but the batch has ", batch.sequences.size(), " sequences");
  const bool qwen = config.family != plan::ModelFamily::llava;
  model::PixelInputs out;
  if (!qwen) {  // LLaVA: one [C, S, S] image per held image
    const model::ClipVisionConfig& v = *config.clip_vision;
    int64_t held = 0;
    for (const plan::Sequence& s : batch.sequences) {
      MMSP_CHECK(s.video_grid_thw.empty(), "load_pixels: ", config.model_type, " takes no videos");
      for (size_t k = 0; k < s.image_grid_thw.size(); ++k) {
        const bool mine = needed(plan::VisionKind::image, static_cast<int64_t>(out.image_offsets.size()));
        out.image_offsets.push_back(mine ? held++ : -1);
      }
    }
    out.images = at::empty({held, v.num_channels, v.image_size, v.image_size}, dtype);
    int64_t item = 0;
    for (size_t b = 0; b < samples.size(); ++b) {
      for (size_t k = 0; k < batch.sequences[b].image_grid_thw.size(); ++k, ++item) {
        const int64_t row = out.image_offsets[item];
        if (row < 0) continue;
        const at::Tensor px = dataset.image_pixels(samples[b], static_cast<int64_t>(k));
        MMSP_CHECK(px.sizes() == out.images[row].sizes(), "load_pixels: sample ", samples[b], " image ", k,
                   " has pixels ", px.sizes(), " but the model takes ", out.images[row].sizes());
        out.images[row].copy_(px);
      }
    }
    return out;
  }
  const model::QwenVisionConfig& v = *config.qwen_vision;
  const int64_t width = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
  for (const plan::VisionKind kind : {plan::VisionKind::image, plan::VisionKind::video}) {
    const bool video = kind == plan::VisionKind::video;
    std::vector<int64_t>& offsets = video ? out.video_offsets : out.image_offsets;
    int64_t rows = 0;  // the held items' patches, in batch order
    for (const plan::Sequence& s : batch.sequences)
      for (const plan::Grid& g : video ? s.video_grid_thw : s.image_grid_thw) {
        const bool mine = needed(kind, static_cast<int64_t>(offsets.size()));
        offsets.push_back(mine ? rows : -1);
        if (mine) rows += g[0] * g[1] * g[2];
      }
    at::Tensor held = at::empty({rows, width}, dtype);  // [Σ held patches, C·tp·p·p]
    int64_t item = 0;
    for (size_t b = 0; b < samples.size(); ++b) {
      const auto& grids = video ? batch.sequences[b].video_grid_thw : batch.sequences[b].image_grid_thw;
      for (size_t k = 0; k < grids.size(); ++k, ++item) {
        if (offsets[item] < 0) continue;
        const plan::Grid& g = grids[k];
        const int64_t patches = g[0] * g[1] * g[2];
        const at::Tensor px = video ? dataset.video_pixels(samples[b], static_cast<int64_t>(k))
                                    : dataset.image_pixels(samples[b], static_cast<int64_t>(k));
        MMSP_CHECK(px.dim() == 2 && px.size(0) == patches && px.size(1) == width, "load_pixels: sample ",
                   samples[b], " ", plan::to_string(kind), " ", k, " has pixels ", px.sizes(), " but grid ",
                   grid_text(g), " needs [", patches, ", ", width, "]");
        held.narrow(0, offsets[item], patches).copy_(px);
      }
    }
    (video ? out.videos : out.images) = held;
  }
  return out;
}

}  // namespace mmsp::train
