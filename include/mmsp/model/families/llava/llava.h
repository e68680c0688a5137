// LLaVA (llava-1.5 style) under sequence parallelism: a CLIP vision tower, the
// multi-modal projector and a Llama decoder, with the checkpoint's names:
// vision_tower.vision_model.{embeddings.{class_embedding, patch_embedding,
// position_embedding}, pre_layrnorm, encoder.layers.N.{layer_norm1, self_attn.{q,k,v,
// out}_proj, layer_norm2, mlp.fc1, mlp.fc2}, post_layernorm}, multi_modal_projector.
// linear_{1,2}, language_model.model.*, language_model.lm_head. Vision rows reach their
// placeholder slots by the same routes and modes as the Qwen family.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "mmsp/attention/token_layout.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/families/llava/clip_config.h"
#include "mmsp/model/hooks/hooked_blocks.h"
#include "mmsp/model/layers/decoder.h"
#include "mmsp/model/layers/linear.h"
#include "mmsp/model/vision/gathered_order.h"
#include "mmsp/model/vision/vision_tower.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {

class ClipVisionTower : public torch::nn::Module {
 public:
  ClipVisionTower(const ClipVisionConfig& vision, const LlavaProjectorConfig& llava);
  // images [N, C, S, S] -> the selected layer's features [N, rows, hidden] (class token
  // dropped for the "default" strategy).
  // No images (N = 0) is only for hooked layers: it runs each layer on no rows, so that
  // its hooks are called as on a rank with images.
  at::Tensor forward(const at::Tensor& images) const;
  // The same for the whole images, then this rank's token ranges of the split ones
  // (vision-tower SP): rows [N·rows + this rank's rows of the split images, hidden]. The
  // class token of a split image lives on context rank 0 alone, attended by every rank's
  // patches through the exchange, and counted once.
  at::Tensor forward(const at::Tensor& images, const SplitShards& split, const at::Tensor& split_images) const;
  // The encoder layers as hook units, recomputed in the backward when set
  // (hooked_blocks.h); the layers above vision_feature_layer never run.
  HookedBlocks& layers() { return hooked_layers_; }

 private:
  struct Layer : torch::nn::Module {
    Layer(const ClipVisionConfig& c);
    std::shared_ptr<LayerNorm> layer_norm1, layer_norm2;
    std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj, fc1, fc2;
  };
  // What every layer's attention over the split images shares (one step): the exchange,
  // each rank's token count, the gathered tokens put image by image (perm; undefined: they
  // already are) and their segments.
  struct SplitAttention {
    SplitExchange exchange;
    std::vector<int64_t> tokens;
    GatheredOrder order;
  };
  // Tokens [t0, t1) of image j (0 is the class token) that context rank r holds.
  std::pair<int64_t, int64_t> split_tokens(const SplitShards& split, size_t j, int r) const;
  SplitAttention split_attention(const SplitShards& split) const;
  // x [T, D] -> [T, D]: the first layout.size() tokens are whole images' (`layout`: one
  // bidirectional segment per image), the rest this rank's tokens of the split images.
  at::Tensor layer_forward(const Layer& l, const at::Tensor& x, const attention::TokenLayout& layout,
                           const SplitAttention& split) const;
  // hidden_states = [embeddings, layer 1, ..., layer L]: vision_feature_layer's index,
  // the number of layers that run.
  int64_t feature_layer() const;
  ClipVisionConfig vision_;
  LlavaProjectorConfig llava_;
  HookedBlocks hooked_layers_;
  at::Tensor class_embedding, patch_weight, position_weight;
  std::shared_ptr<LayerNorm> pre_layrnorm_, post_layernorm_;
  std::vector<std::shared_ptr<Layer>> layers_;
};

// The CLIP tower and the multi-modal projector as the VLM's vision tower
// (vision_tower.h): pixels.images [N_images, C, S, S] in batch order -> rows
// [Σ rows, text hidden], the projector's output.
class LlavaTower : public VisionTower {
 public:
  // Parameters drawn in this order: the CLIP tower, projector linear_1, linear_2.
  LlavaTower(const ClipVisionConfig& vision, const LlavaProjectorConfig& llava, int64_t text_hidden);
  TowerInput gather(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels) const override;
  TowerInput no_items(const at::TensorOptions& options) const override;
  at::Tensor encode(const TowerInput& input) const override;
  // Vision-tower SP: the split images whole (a rank embeds only its tokens of each).
  void add_split(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels, const SplitEncoding& split,
                 TowerInput& input) const override;
  int64_t row_width() const override { return text_hidden_; }
  HookedBlocks& blocks() override { return clip->layers(); }

  std::shared_ptr<ClipVisionTower> clip;
  std::shared_ptr<torch::nn::Module> projector;  // multi_modal_projector.{linear_1, linear_2}

 private:
  ClipVisionConfig vision_;
  LlavaProjectorConfig llava_;
  int64_t text_hidden_;
  std::shared_ptr<Linear> linear_1_, linear_2_;
};

// vision_tower.*, multi_modal_projector.*, language_model.* (the decoder), in that order.
std::shared_ptr<Vlm> build_llava(const ModelConfig& config);

}  // namespace mmsp::model
