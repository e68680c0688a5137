// The Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 model under sequence parallelism:
// Vision DP (each rank encodes the whole images the plan gives it), vision rows — and
// Qwen3-VL's deepstack rows, on the same routes in the same message — sent to the ranks
// that hold their placeholder tokens, spliced into the token embeddings, then the
// decoder (deepstack added after its first layers). Parameter names are the
// checkpoints': Qwen2/2.5-VL visual.*, model.*, lm_head.*; Qwen3-VL model.visual.*,
// model.language_model.*, lm_head.*.
#pragma once

#include <memory>
#include <vector>

#include "mmsp/model/config.h"
#include "mmsp/model/decoder.h"
#include "mmsp/model/families/qwen_vl/qwen_vision.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {

class QwenVLModel : public Vlm {
 public:
  // Parameters are drawn from the current ATen generator (seed it for replicas).
  explicit QwenVLModel(const ModelConfig& config);

  StepOutput forward(const plan::Batch& batch, const plan::StepPlan& plan, const PixelInputs& pixels,
                     const StepGroups& groups, VisionMode mode,
                     const attention::AttentionOptions& attention = {}) const override;

  // Rows [V, hidden·(1 + deepstack levels)]: the merger's row, then each deepstack level's.
  at::Tensor vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels, const StepGroups& groups,
                         VisionMode mode) const override;

  const ModelConfig& config() const override { return config_; }
  Decoder& decoder() const override { return *decoder_; }
  // A rank without images runs them on no rows while they are hooked, so that every
  // rank calls the same hooks in the same order.
  HookedBlocks& vision_blocks() const override { return visual_->blocks(); }

 private:
  at::Tensor encode(const std::vector<plan::VisionItem>& items, const std::vector<int64_t>& which,
                    const PixelInputs& pixels) const;

  ModelConfig config_;
  std::shared_ptr<QwenVisionEncoder> visual_;
  std::shared_ptr<Decoder> decoder_;
  int64_t row_width_ = 0;  // hidden · (1 + deepstack levels)
};

}  // namespace mmsp::model
