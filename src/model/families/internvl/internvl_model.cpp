// InternVL: tower, pixel shuffle, projector, decoder; see internvl_model.h. Follows
// transformers' InternVLModel.get_image_features (last layer, class token dropped,
// pixel shuffle, projector) and masked_scatter of the rows into <IMG_CONTEXT> tokens.
#include "mmsp/model/families/internvl/internvl_model.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "mmsp/core/check.h"
#include "mmsp/model/families/internvl/pixel_shuffle.h"
#include "mmsp/model/phase_marker.h"
#include "mmsp/model/rank_inputs.h"

namespace mmsp::model {

InternVLModel::InternVLModel(const ModelConfig& config) : config_(config) {
  MMSP_CHECK(config.intern_vision && config.internvl, "model_type ", config.model_type,
             " is not InternVL (no internvl_vision vision_config)");
  const InternVisionConfig& v = *config.intern_vision;
  const int64_t k = config.internvl->scale();
  tower_ = register_module("vision_tower", std::make_shared<InternVisionTower>(v));
  projector_ = register_module(
      "multi_modal_projector",
      std::make_shared<InternVLProjector>(v.hidden_size * k * k, config.text.hidden_size,
                                          config.internvl->projector_hidden_act, config.text.initializer_range));
  decoder_ = register_module("language_model", std::make_shared<Decoder>(config.text, config.tie_word_embeddings));
}

at::Tensor InternVLModel::encode_tiles(const at::Tensor& tiles) const {
  at::Tensor features = tower_->forward(tiles);                             // [N, P, D]
  at::Tensor shuffled = model::pixel_shuffle(features, config_.internvl->scale());  // [N, P/k², k²·D]
  return projector_->forward(shuffled).reshape({-1, config_.text.hidden_size});
}

at::Tensor InternVLModel::encode(const std::vector<plan::VisionItem>& items, const std::vector<int64_t>& which,
                                 const PixelInputs& pixels) const {
  const at::Tensor& w = decoder_->model->embed_tokens->weight;
  if (which.empty() && !tower_->layers().hooked())  // still in the graph: this rank joins the routing backward
    return at::zeros({0, config_.text.hidden_size}, w.options()).requires_grad_();
  PhaseScope vision(Phase::vision);
  const InternVisionConfig& v = *config_.intern_vision;
  const int64_t side = v.patches_per_side();
  std::vector<at::Tensor> tiles;
  if (which.empty())  // hooked layers: run on no tiles, calling their hooks as the other ranks do
    tiles.push_back(at::zeros({0, v.num_channels, v.image_size, v.image_size}, w.options()));
  for (int64_t i : which) {
    const plan::VisionItem& item = items.at(i);
    MMSP_CHECK(item.kind == plan::VisionKind::image, "InternVL takes images only");
    MMSP_CHECK(item.grid[1] == side && item.grid[2] == side, "InternVL image ", item.batch_index, " has grid [",
               item.grid[0], ", ", item.grid[1], ", ", item.grid[2], "]; a tile is [1, ", side, ", ", side, "]");
    const int64_t first = pixels.first_row(item, item.patch_offset / (side * side));
    MMSP_CHECK(pixels.images.defined() && pixels.images.size(0) >= first + item.grid[0], "InternVL needs the tiles ",
               first, "..", first + item.grid[0] - 1, " of image ", item.batch_index, ", but pixels hold ",
               pixels.images.defined() ? pixels.images.size(0) : 0, " tiles");
    tiles.push_back(pixels.images.narrow(0, first, item.grid[0]));
  }
  at::Tensor rows = encode_tiles(at::cat(tiles, 0));  // [Σ tiles · rows per tile, hidden]
  return enter_phase_in_backward(rows, Phase::vision);
}

void InternVLModel::check_tiles(const plan::StepPlan& plan, const PixelInputs& pixels) const {
  const InternVisionConfig& v = *config_.intern_vision;
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
      const bool held = pixels.image_offsets.empty() ||
                        (item.batch_index < static_cast<int64_t>(pixels.image_offsets.size()) &&
                         pixels.image_offsets[item.batch_index] >= 0);
      if (held) tiles += g[0];
    }
  const at::Tensor& px = pixels.images;
  MMSP_CHECK(tiles == 0 || (px.defined() && px.dim() == 4 && px.size(0) == tiles && px.size(1) == v.num_channels &&
                            px.size(2) == v.image_size && px.size(3) == v.image_size),
             "InternVL tiles must be [N, ", v.num_channels, ", ", v.image_size, ", ", v.image_size, "] with N = ", tiles,
             " (the image_grid_thw tile counts of the images held here), got ",
             px.defined() ? detail::concat(px.sizes()) : std::string("no pixels"));
}

void InternVLModel::check_lengths(const plan::Batch& batch) const {
  for (const plan::Sequence& s : batch.sequences)
    // transformers' "dynamic" RoPE (InternVL3's decoders) moves its frequencies beyond this length.
    MMSP_CHECK(static_cast<int64_t>(s.input_ids.size()) <= config_.text.max_position_embeddings, "a sequence of ",
               s.input_ids.size(), " tokens is longer than text_config.max_position_embeddings (",
               config_.text.max_position_embeddings, "), beyond which InternVL's RoPE changes; shorten it");
}

StepOutput InternVLModel::forward(const plan::Batch& batch, const plan::StepPlan& plan, const PixelInputs& pixels,
                                  const StepGroups& groups, VisionMode mode,
                                  const attention::AttentionOptions& attention) const {
  check_lengths(batch);  // both the same on every rank, before the routes' first collective
  check_tiles(plan, pixels);
  RankInputs in = rank_inputs(batch, plan);
  at::Tensor embeds = decoder_->embed(in.token_ids);
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  RoutedRows routed = route_vision_rows(
      plan, [&](const std::vector<int64_t>& which) { return encode(items, which, pixels); }, groups.context, mode);
  embeds = embeds.index_copy(0, routed.slots, routed.rows.to(embeds.scalar_type()));
  const DecoderContext ctx =
      decoder_context(in, config_.text, config_.conventions, {groups.ring, groups.ulysses}, attention, embeds);
  return {decoder_->final_hidden(embeds, ctx), decoder_->head_weight(), in.labels, in.label_count};
}

at::Tensor InternVLModel::vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels, const StepGroups& groups,
                                      VisionMode mode) const {
  check_tiles(plan, pixels);
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  return route_vision_rows(
             plan, [&](const std::vector<int64_t>& which) { return encode(items, which, pixels); }, groups.context, mode)
      .rows;
}

}  // namespace mmsp::model
