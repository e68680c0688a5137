// Filling this rank's pixel tensors item by item, only the items it encodes, in the
// family's layout (model::PixelGeometry).
#include "mmsp/train/data/step_pixels.h"

#include <algorithm>
#include <utility>

#include "mmsp/core/check.h"
#include "mmsp/model/family.h"

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
    // Vision-tower SP: every context rank reads a split item's pixels (and encodes its shard).
    for (int64_t i : plan.mine.routes.split_items) wanted.emplace_back(items.at(i).kind, items.at(i).batch_index);
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
  const std::shared_ptr<const model::PixelGeometry> geometry = model::pixel_geometry(config);
  model::PixelInputs out;
  for (const plan::VisionKind kind : {plan::VisionKind::image, plan::VisionKind::video}) {
    const bool video = kind == plan::VisionKind::video;
    std::vector<int64_t>& offsets = video ? out.video_offsets : out.image_offsets;
    int64_t rows = 0;  // the held items' rows, in batch order
    for (const plan::Sequence& s : batch.sequences) {
      MMSP_CHECK(!video || s.video_grid_thw.empty() || geometry->takes_videos(), "load_pixels: ",
                 config.model_type, " takes no videos");
      for (const plan::Grid& g : video ? s.video_grid_thw : s.image_grid_thw) {
        const bool mine = needed(kind, static_cast<int64_t>(offsets.size()));
        offsets.push_back(mine ? rows : -1);
        if (mine) rows += geometry->batch_rows(g);
      }
    }
    if (video && !geometry->takes_videos()) break;  // videos stay undefined
    std::vector<int64_t> shape = geometry->row_shape();
    shape.insert(shape.begin(), rows);
    at::Tensor held = at::empty(shape, dtype);  // [Σ rows of the held items, row_shape...]
    int64_t item = 0;
    for (size_t b = 0; b < samples.size(); ++b) {
      const auto& grids = video ? batch.sequences[b].video_grid_thw : batch.sequences[b].image_grid_thw;
      for (size_t k = 0; k < grids.size(); ++k, ++item) {
        if (offsets[item] < 0) continue;
        const plan::Grid& g = grids[k];
        const at::Tensor px = video ? dataset.video_pixels(samples[b], static_cast<int64_t>(k))
                                    : dataset.image_pixels(samples[b], static_cast<int64_t>(k));
        const std::vector<int64_t> want = geometry->item_shape(g);
        MMSP_CHECK(px.sizes() == at::IntArrayRef(want), "load_pixels: sample ", samples[b], " ",
                   plan::to_string(kind), " ", k, " has pixels ", px.sizes(), " but grid ", grid_text(g),
                   " needs ", at::IntArrayRef(want), " (", geometry->item_layout(), ")");
        at::Tensor rows_of_item = held.narrow(0, offsets[item], geometry->batch_rows(g));
        rows_of_item.copy_(px.view(rows_of_item.sizes()));
      }
    }
    (video ? out.videos : out.images) = held;
  }
  return out;
}

}  // namespace mmsp::train
