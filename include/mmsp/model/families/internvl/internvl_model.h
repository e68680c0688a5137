// InternVL (the Hugging Face `internvl` format of InternVL3 / 3.5) under sequence
// parallelism: the InternViT tower encodes each tile of an image, pixel shuffle merges
// 2×2 patches into one row, the projector maps rows to the decoder's width, and the rows
// reach their <IMG_CONTEXT> slots by the same routes and vision modes as every family;
// the decoder is the Qwen2 / Qwen3 one with 1-D positions. Names as the checkpoints':
// vision_tower.*, multi_modal_projector.*, language_model.model.*, language_model.lm_head.
#pragma once

#include <memory>
#include <vector>

#include "mmsp/model/config.h"
#include "mmsp/model/decoder.h"
#include "mmsp/model/families/internvl/intern_vit.h"
#include "mmsp/model/families/internvl/internvl_projector.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {

class InternVLModel : public Vlm {
 public:
  explicit InternVLModel(const ModelConfig& config);

  // pixels.images: the tiles [Σ tiles, C, S, S] of the images held here (PixelInputs), in batch order, each
  // image's tiles in the processor's order (grid row-major, then the thumbnail); an
  // image's grid is [tiles, S/p, S/p].
  StepOutput forward(const plan::Batch& batch, const plan::StepPlan& plan, const PixelInputs& pixels,
                     const StepGroups& groups, VisionMode mode,
                     const attention::AttentionOptions& attention = {}) const override;
  Decoder& decoder() const override { return *decoder_; }
  HookedBlocks& vision_blocks() const override { return tower_->layers(); }
  const ModelConfig& config() const override { return config_; }

  // Rows [V, hidden]: the projector's output.
  at::Tensor vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels, const StepGroups& groups,
                         VisionMode mode) const override;

  // tiles [N, C, S, S] -> rows [N · image_seq_length, text hidden]: tower, pixel shuffle, projector.
  at::Tensor encode_tiles(const at::Tensor& tiles) const;

 private:
  // What every rank can check alike before any collective, from the plan (every dp row's
  // items, so the whole batch): no videos, grids of whole tiles, the tiles' shape and count.
  void check_tiles(const plan::StepPlan& plan, const PixelInputs& pixels) const;
  // Sequences within max_position_embeddings (forward only: vision_rows has no decoder).
  void check_lengths(const plan::Batch& batch) const;
  at::Tensor encode(const std::vector<plan::VisionItem>& items, const std::vector<int64_t>& which,
                    const PixelInputs& pixels) const;
  ModelConfig config_;
  std::shared_ptr<InternVisionTower> tower_;
  std::shared_ptr<InternVLProjector> projector_;
  std::shared_ptr<Decoder> decoder_;
};

}  // namespace mmsp::model
