// Filling the batch's pixel tensors item by item, only where this rank encodes; the
// layout is the family's (model::PixelGeometry).
#include "mmsp/train/step_pixels.h"

#include "mmsp/core/check.h"
#include "mmsp/model/family.h"

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
  const std::shared_ptr<const model::PixelGeometry> geometry = model::pixel_geometry(config);
  model::PixelInputs out;
  for (const plan::VisionKind kind : {plan::VisionKind::image, plan::VisionKind::video}) {
    const bool video = kind == plan::VisionKind::video;
    int64_t rows = 0;
    for (const plan::Sequence& s : batch.sequences) {
      MMSP_CHECK(!video || s.video_grid_thw.empty() || geometry->takes_videos(), "load_pixels: ",
                 config.model_type, " takes no videos");
      for (const plan::Grid& g : video ? s.video_grid_thw : s.image_grid_thw) rows += geometry->batch_rows(g);
    }
    if (video && !geometry->takes_videos()) break;  // videos stay undefined
    std::vector<int64_t> shape = geometry->row_shape();
    shape.insert(shape.begin(), rows);
    at::Tensor all = at::zeros(shape, at::kFloat);  // [Σ rows of the items, row_shape...]
    int64_t item = 0, offset = 0;
    for (size_t b = 0; b < samples.size(); ++b) {
      const auto& grids = video ? batch.sequences[b].video_grid_thw : batch.sequences[b].image_grid_thw;
      for (size_t k = 0; k < grids.size(); ++k, ++item) {
        const plan::Grid& g = grids[k];
        const int64_t item_rows = geometry->batch_rows(g);
        if (needed(kind, item)) {
          const at::Tensor px = video ? dataset.video_pixels(samples[b], static_cast<int64_t>(k))
                                      : dataset.image_pixels(samples[b], static_cast<int64_t>(k));
          const std::vector<int64_t> want = geometry->item_shape(g);
          MMSP_CHECK(px.sizes() == at::IntArrayRef(want), "load_pixels: sample ", samples[b], " ",
                     plan::to_string(kind), " ", k, " has pixels ", px.sizes(), " but grid ", grid_text(g),
                     " needs ", at::IntArrayRef(want), " (", geometry->item_layout(), ")");
          all.narrow(0, offset, item_rows).copy_(px.view(all.narrow(0, offset, item_rows).sizes()));
        }
        offset += item_rows;
      }
    }
    (video ? out.videos : out.images) = all.to(dtype);
  }
  return out;
}

}  // namespace mmsp::train
