// InternVL (the Hugging Face `internvl` format of InternVL3 / 3.5) under sequence
// parallelism: the InternViT tower encodes each tile of an image, pixel shuffle merges
// 2×2 patches into one row, the projector maps rows to the decoder's width, and the rows
// reach their <IMG_CONTEXT> slots by the same routes and vision modes as every family;
// the decoder is the Qwen2 / Qwen3 one with 1-D positions. Names as the checkpoints':
// vision_tower.*, multi_modal_projector.*, language_model.model.*, language_model.lm_head.
#pragma once

#include <memory>
#include <vector>

#include "mmsp/model/config/config.h"
#include "mmsp/model/families/internvl/intern_vit.h"
#include "mmsp/model/families/internvl/internvl_config.h"
#include "mmsp/model/families/internvl/internvl_projector.h"
#include "mmsp/model/layers/decoder.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {

// InternViT, pixel shuffle and the projector as the VLM's vision tower (vision_tower.h).
// pixels.images: the tiles [Σ tiles, C, S, S] of the images held here (PixelInputs), in
// batch order, each image's tiles in the processor's order (grid row-major, then the
// thumbnail); an image's grid is [tiles, S/p, S/p].
class InternVLTower : public VisionTower {
 public:
  // Parameters drawn in this order: the tower, then the projector.
  InternVLTower(const InternVisionConfig& vision, const InternVLProjectorConfig& internvl, const TextConfig& text);
  TowerInput gather(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels) const override;
  TowerInput no_items(const at::TensorOptions& options) const override;
  // Vision-tower SP: this rank's tiles of each split image, after the whole images' (a
  // tile is encoded alone: nothing is exchanged).
  void add_split(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels, const SplitEncoding& split,
                 TowerInput& input) const override;
  // tiles [N, C, S, S] -> rows [N · image_seq_length, text hidden]: tower, pixel shuffle, projector.
  at::Tensor encode(const TowerInput& input) const override;
  int64_t row_width() const override { return text_hidden_; }
  HookedBlocks& blocks() override { return vit->layers(); }
  // No videos, grids of whole tiles, the tiles' shape and count, over every dp row's
  // items (the whole batch), before any collective.
  void check(const plan::StepPlan& plan, const PixelInputs& pixels) const override;

  std::shared_ptr<InternVisionTower> vit;
  std::shared_ptr<InternVLProjector> projector;

 private:
  InternVisionConfig vision_;
  int64_t scale_;  // pixel shuffle's k = 1 / downsample_ratio
  int64_t text_hidden_;
};

// vision_tower.*, multi_modal_projector.*, language_model.* (the decoder), in that order;
// sequences longer than text max_position_embeddings refused (VlmRules).
std::shared_ptr<Vlm> build_internvl(const ModelConfig& config);

}  // namespace mmsp::model
