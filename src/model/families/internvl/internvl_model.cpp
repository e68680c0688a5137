// InternVL: tower, pixel shuffle, projector, decoder; see internvl_model.h. Follows
// transformers' InternVLModel.get_image_features (last layer, class token dropped,
// pixel shuffle, projector) and masked_scatter of the rows into <IMG_CONTEXT> tokens.
#include "mmsp/model/families/internvl/internvl_model.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "mmsp/core/check.h"
#include "mmsp/model/families/internvl/internvl_config.h"
#include "mmsp/model/families/internvl/pixel_shuffle.h"

namespace mmsp::model {

InternVLTower::InternVLTower(const InternVisionConfig& v, const InternVLProjectorConfig& internvl,
                             const TextConfig& text)
    : vision_(v), scale_(internvl.scale()), text_hidden_(text.hidden_size) {
  vit = std::make_shared<InternVisionTower>(v);
  projector = std::make_shared<InternVLProjector>(v.hidden_size * scale_ * scale_, text.hidden_size,
                                                  internvl.projector_hidden_act, text.initializer_range);
}

at::Tensor InternVLTower::encode(const TowerInput& input) const {
  at::Tensor features = vit->forward(input.pixels);              // [N, P, D]
  at::Tensor shuffled = model::pixel_shuffle(features, scale_);  // [N, P/k², k²·D]
  return projector->forward(shuffled).reshape({-1, text_hidden_});
}

TowerInput InternVLTower::no_items(const at::TensorOptions& options) const {
  return {at::zeros({0, vision_.num_channels, vision_.image_size, vision_.image_size}, options), {}};
}

TowerInput InternVLTower::gather(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels) const {
  const int64_t side = vision_.patches_per_side();
  std::vector<at::Tensor> tiles;
  for (const plan::VisionItem& item : items) {
    MMSP_CHECK(item.kind == plan::VisionKind::image, "InternVL takes images only");
    MMSP_CHECK(item.grid[1] == side && item.grid[2] == side, "InternVL image ", item.batch_index, " has grid [",
               item.grid[0], ", ", item.grid[1], ", ", item.grid[2], "]; a tile is [1, ", side, ", ", side, "]");
    const int64_t first = pixels.first_row(item, item.patch_offset / (side * side));
    MMSP_CHECK(pixels.images.defined() && pixels.images.size(0) >= first + item.grid[0], "InternVL needs the tiles ",
               first, "..", first + item.grid[0] - 1, " of image ", item.batch_index, ", but pixels hold ",
               pixels.images.defined() ? pixels.images.size(0) : 0, " tiles");
    tiles.push_back(pixels.images.narrow(0, first, item.grid[0]));
  }
  return {at::cat(tiles, 0), {}};  // [Σ tiles, C, S, S]
}

void InternVLTower::add_split(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels,
                              const SplitEncoding& split, TowerInput& input) const {
  const int64_t side = vision_.patches_per_side();
  std::vector<at::Tensor> tiles{input.pixels};
  for (const plan::VisionItem& item : items) {
    MMSP_ASSERT(item.split() && item.grid[0] > 0 && item.rows % item.grid[0] == 0);
    const int64_t per_tile = item.rows / item.grid[0];
    const int64_t first = item.shard_rows.at(split.rank), rows = item.rows_encoded_by(split.rank);
    MMSP_ASSERT(first % per_tile == 0 && rows % per_tile == 0, "InternVL shards are whole tiles");
    const int64_t at = pixels.row_of(item, item.patch_offset / (side * side), first / per_tile, rows / per_tile);
    tiles.push_back(pixels.images.narrow(0, at, rows / per_tile));
  }
  input.pixels = at::cat(tiles, 0);
}

void InternVLTower::check(const plan::StepPlan& plan, const PixelInputs& pixels) const {
  const InternVisionConfig& v = vision_;
  const int64_t side = v.patches_per_side();
  int64_t tiles = 0;
  for (const plan::RowPlan& row : plan.rows)
    for (const plan::VisionItem& item : row.items) {
      MMSP_CHECK(item.kind == plan::VisionKind::image, "InternVL takes images only; the batch has videos");
      const plan::Grid& g = item.grid;
      MMSP_CHECK(g[1] == side && g[2] == side, "InternVL image ", item.batch_index, " has grid [", g[0], ", ", g[1],
                 ", ", g[2], "], but every image is [tiles, ", side, ", ", side, "]: tiles of image_size / ",
                 "patch_size = ", v.image_size, " / ", v.patch_size, " patches a side");
      // Only the images held here count (a rank under Vision DP holds those it encodes).
      const bool held =
          pixels.image_offsets.empty() || (item.batch_index < static_cast<int64_t>(pixels.image_offsets.size()) &&
                                           pixels.image_offsets[item.batch_index] >= 0);
      // A split image's tiles: only this rank's shard of them is held (pixel_inputs.h).
      const bool partial = held && !pixels.image_held_rows.empty();
      if (held) tiles += partial ? pixels.image_held_rows.at(item.batch_index) : g[0];
    }
  const at::Tensor& px = pixels.images;
  MMSP_CHECK(tiles == 0 || (px.defined() && px.dim() == 4 && px.size(0) == tiles && px.size(1) == v.num_channels &&
                            px.size(2) == v.image_size && px.size(3) == v.image_size),
             "InternVL tiles must be [N, ", v.num_channels, ", ", v.image_size, ", ", v.image_size,
             "] with N = ", tiles, " (the image_grid_thw tile counts of the images held here), got ",
             px.defined() ? detail::concat(px.sizes()) : std::string("no pixels"));
}

std::shared_ptr<Vlm> build_internvl(const ModelConfig& config) {
  MMSP_CHECK(intern_vision_of(config) && internvl_projector_of(config), "model_type ", config.model_type,
             " is not InternVL (no internvl_vision vision_config)");
  auto tower = std::make_shared<InternVLTower>(*intern_vision_of(config), *internvl_projector_of(config), config.text);
  auto decoder = std::make_shared<Decoder>(config.text, config.tie_word_embeddings);
  // transformers' "dynamic" RoPE (InternVL3's decoders) moves its frequencies beyond max_position_embeddings.
  auto vlm = std::make_shared<Vlm>(config, decoder, tower, VlmRules{/*positions_within_max=*/true});
  vlm->register_module("vision_tower", tower->vit);
  vlm->register_module("multi_modal_projector", tower->projector);
  vlm->register_module("language_model", decoder);
  return vlm;
}

}  // namespace mmsp::model
