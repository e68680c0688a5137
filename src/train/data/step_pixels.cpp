// Filling this rank's pixel tensors item by item, only the items it encodes, in the
// family's layout (model::PixelGeometry).
#include "mmsp/train/data/step_pixels.h"

#include <algorithm>
#include <map>
#include <utility>

#include "mmsp/core/check.h"
#include "mmsp/model/family.h"

namespace mmsp::train {

namespace {

std::string grid_text(const plan::Grid& g) { return detail::concat("[", g[0], ", ", g[1], ", ", g[2], "]"); }

}  // namespace

PixelsNeeded pixels_encoded_here(const plan::StepPlan& plan, model::VisionMode mode) {
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  std::map<std::pair<plan::VisionKind, int64_t>, HeldPart> wanted;
  const HeldPart whole{true, true, 0, 0};
  if (mode == model::VisionMode::replicate) {
    for (const auto& item : items) wanted[{item.kind, item.batch_index}] = whole;
  } else {
    for (int64_t i : plan.mine.routes.encoder_items) wanted[{items.at(i).kind, items.at(i).batch_index}] = whole;
    // Vision-tower SP: each context rank reads only its shard's rows of a split item.
    const int me = plan.mine.coords.context_rank(plan.options.mesh);
    for (int64_t i : plan.mine.routes.split_items) {
      const plan::VisionItem& item = items.at(i);
      wanted[{item.kind, item.batch_index}] = {true, false, item.shard_rows.at(me), item.rows_encoded_by(me)};
    }
  }
  return [wanted = std::move(wanted)](plan::VisionKind kind, int64_t item) {
    const auto it = wanted.find({kind, item});
    return it == wanted.end() ? HeldPart{} : it->second;
  };
}

model::PixelInputs load_pixels(const Dataset& dataset, const std::vector<int64_t>& samples, const plan::Batch& batch,
                               const model::ModelConfig& config, const PixelsNeeded& needed, at::ScalarType dtype) {
  MMSP_CHECK(samples.size() == batch.sequences.size(), "load_pixels: ", samples.size(), " samples but the batch has ",
             batch.sequences.size(), " sequences");
  const std::shared_ptr<const model::PixelGeometry> geometry = model::pixel_geometry(config);
  model::PixelInputs out;
  for (const plan::VisionKind kind : {plan::VisionKind::image, plan::VisionKind::video}) {
    const bool video = kind == plan::VisionKind::video;
    std::vector<int64_t>& offsets = video ? out.video_offsets : out.image_offsets;
    std::vector<HeldPart> parts;
    bool partial = false;
    int64_t rows = 0;  // the held items' rows, in batch order
    for (const plan::Sequence& s : batch.sequences) {
      MMSP_CHECK(!video || s.video_grid_thw.empty() || geometry->takes_videos(), "load_pixels: ", config.model_type,
                 " takes no videos");
      for (const plan::Grid& g : video ? s.video_grid_thw : s.image_grid_thw) {
        HeldPart part = needed(kind, static_cast<int64_t>(offsets.size()));
        // A shard's embedding rows as pixel rows, where they map exactly; else the whole item.
        const int64_t pixel_rows = geometry->batch_rows(g), rows_of_item = geometry->placeholder_rows(g);
        if (part.any && !part.whole && rows_of_item > 0 && (part.first * pixel_rows) % rows_of_item == 0 &&
            (part.rows * pixel_rows) % rows_of_item == 0) {
          part.first = part.first * pixel_rows / rows_of_item;
          part.rows = part.rows * pixel_rows / rows_of_item;
        } else {
          part.whole = true;
        }
        if (part.any && part.whole) part.first = 0, part.rows = pixel_rows;
        MMSP_CHECK(!part.any || (part.first >= 0 && part.first + part.rows <= geometry->batch_rows(g)),
                   "load_pixels: rows ", part.first, "..", part.first + part.rows, " of ", plan::to_string(kind), " ",
                   offsets.size(), " are beyond its ", geometry->batch_rows(g), " rows");
        partial = partial || (part.any && !part.whole);
        offsets.push_back(part.any ? rows : -1);
        if (part.any) rows += part.rows;
        parts.push_back(part);
      }
    }
    if (partial)
      for (const HeldPart& part : parts) {
        (video ? out.video_held_from : out.image_held_from).push_back(part.first);
        (video ? out.video_held_rows : out.image_held_rows).push_back(part.rows);
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
        const HeldPart& part = parts[item];
        if (video && !part.whole) {  // a share of a split video: only its frames are decoded
          const at::Tensor px = dataset.video_pixel_rows(samples[b], static_cast<int64_t>(k), part.first, part.rows);
          std::vector<int64_t> want = geometry->row_shape();
          want.insert(want.begin(), part.rows);
          MMSP_CHECK(px.sizes() == at::IntArrayRef(want), "load_pixels: sample ", samples[b], " video ", k, " rows ",
                     part.first, "..", part.first + part.rows, " have pixels ", px.sizes(), ", not ",
                     at::IntArrayRef(want));
          held.narrow(0, offsets[item], part.rows).copy_(px);
          continue;
        }
        const at::Tensor px = video ? dataset.video_pixels(samples[b], static_cast<int64_t>(k))
                                    : dataset.image_pixels(samples[b], static_cast<int64_t>(k));
        const std::vector<int64_t> want = geometry->item_shape(g);
        MMSP_CHECK(px.sizes() == at::IntArrayRef(want), "load_pixels: sample ", samples[b], " ", plan::to_string(kind),
                   " ", k, " has pixels ", px.sizes(), " but grid ", grid_text(g), " needs ", at::IntArrayRef(want),
                   " (", geometry->item_layout(), ")");
        std::vector<int64_t> all_rows = geometry->row_shape();
        all_rows.insert(all_rows.begin(), geometry->batch_rows(g));
        held.narrow(0, offsets[item], part.rows).copy_(px.view(all_rows).narrow(0, part.first, part.rows));
      }
    }
    (video ? out.videos : out.images) = held;
  }
  return out;
}

}  // namespace mmsp::train
