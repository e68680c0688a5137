// The Qwen2-VL / Qwen3-VL model under sequence parallelism: Vision DP (each rank
// encodes the whole images the plan gives it), vision rows — and Qwen3-VL's deepstack
// rows, on the same routes in the same message — sent to the ranks that hold their
// placeholder tokens, spliced into the token embeddings, then the decoder (deepstack
// added after its first layers). Parameter names are the checkpoints': Qwen2-VL
// visual.*, model.*, lm_head.*; Qwen3-VL model.visual.*, model.language_model.*, lm_head.*.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "mmsp/dist/group.h"
#include "mmsp/model/config.h"
#include "mmsp/model/decoder.h"
#include "mmsp/model/qwen_vision.h"
#include "mmsp/model/recompute.h"
#include "mmsp/model/vision_routing.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::model {

// Pixels in the processor's layout: rows of flattened patches, images in batch order
// (image_grid_thw order), videos likewise; LLaVA: one [C, S, S] image per row.
// Either the whole batch (the offset lists empty: an item starts at its patch_offset,
// a LLaVA image at its batch_index) or only some items, as a rank under Vision DP holds
// the items it encodes (train::load_pixels): then image_offsets[batch_index] is where
// the image's rows start, −1 for an image not held here; videos likewise.
struct PixelInputs {
  at::Tensor images;  // [Σ image patches held, C·tp·p·p]
  at::Tensor videos;  // [Σ video patches held, C·tp·p·p] (may be undefined when there are none)
  std::vector<int64_t> image_offsets, video_offsets;

  // First row of `item` in images / videos; throws when the item is not held here.
  int64_t first_row(const plan::VisionItem& item, int64_t whole_batch_row) const;
};

// The groups a step runs on: context (vision routing), ring and ulysses (attention).
struct StepGroups {
  dist::GroupPtr context, ring, ulysses;
};

class QwenVLModel : public torch::nn::Module {
 public:
  // Parameters are drawn from the current ATen generator (seed it for replicas).
  explicit QwenVLModel(const ModelConfig& config);

  // What the loss needs for plan.mine's slots: the final hidden states [L, hidden] and
  // the LM head's weight [vocab, hidden] (the embedding when tied), so that the logits
  // can be made a chunk at a time; the labels [L] and the global label count.
  struct StepOutput {
    at::Tensor hidden, head_weight, labels;
    int64_t label_count = 0;
    at::Tensor logits() const;  // [L, vocab], all at once (tests, benchmarks)
  };
  StepOutput forward(const plan::Batch& batch, const plan::StepPlan& plan, const PixelInputs& pixels,
                     const StepGroups& groups, VisionMode mode,
                     const attention::AttentionOptions& attention = {}) const;

  // The vision part alone: for this rank's placeholder slots, in arrival order
  // (routes.recv from rank 0 first; each row's slot is in the route), the rows
  // [V, hidden·(1 + deepstack levels)]: the merger's row, then each deepstack level's.
  at::Tensor vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels,
                         const StepGroups& groups, VisionMode mode) const;

  const ModelConfig& config() const { return config_; }
  void set_activation_checkpointing(ActivationCheckpointing mode);
  Decoder& decoder() const { return *decoder_; }

 private:
  at::Tensor encode(const std::vector<plan::VisionItem>& items, const std::vector<int64_t>& which,
                    const PixelInputs& pixels) const;

  ModelConfig config_;
  std::shared_ptr<QwenVisionEncoder> visual_;
  std::shared_ptr<Decoder> decoder_;
  int64_t row_width_ = 0;  // hidden · (1 + deepstack levels)
};

}  // namespace mmsp::model
