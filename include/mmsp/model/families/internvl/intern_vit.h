// InternViT, InternVL's vision tower, as transformers' InternVLVisionModel builds it:
// a conv patch embedding, a class token and a learned position table, then layers of
// pre-norm attention (optional RMSNorm of the whole query and key) and MLP, each branch
// scaled by a learned per-channel vector (layer scale) before its residual add.
// Parameter names are the checkpoint's, under vision_tower.: embeddings.{cls_token,
// patch_embeddings.projection, position_embeddings}, encoder.layer.N.{layernorm_before,
// attention.{q,k,v}_proj, attention.{q,k}_norm, attention.projection_layer, lambda_1,
// layernorm_after, mlp.fc1, mlp.fc2, lambda_2}, layernorm (only without mean pooling).
// Tiles come already cut (dynamic_tiling.h); pixel shuffle and projector are apart.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mmsp/attention/token_layout.h"
#include "mmsp/model/families/internvl/internvl_config.h"
#include "mmsp/model/hooks/hooked_blocks.h"
#include "mmsp/model/layers/activation.h"
#include "mmsp/model/layers/linear.h"

namespace mmsp::model {

class InternVisionTower : public torch::nn::Module {
 public:
  explicit InternVisionTower(const InternVisionConfig& config);
  // tiles [N, C, S, S] (S = image_size) -> patch features [N, P, D], P = (S/p)², the class
  // token dropped (vision_feature_select_strategy "default"), patches row-major.
  // No tiles (N = 0) is only for hooked layers: it runs each layer on no rows, so that
  // its hooks are called as on a rank with tiles.
  at::Tensor forward(const at::Tensor& tiles) const;
  // The encoder layers as hook units, recomputed in the backward when set (hooked_blocks.h).
  HookedBlocks& layers() { return hooked_layers_; }

  // One layer's norm, LayerNorm or RMSNorm by norm_type, registered under its own name.
  struct Norm {
    Norm(torch::nn::Module& parent, const std::string& name, const InternVisionConfig& c);
    at::Tensor operator()(const at::Tensor& x) const;
    std::shared_ptr<LayerNorm> layer_norm;
    std::shared_ptr<RMSNorm> rms_norm;
  };
  struct Layer : torch::nn::Module {
    Layer(const InternVisionConfig& c);
    std::optional<Norm> layernorm_before, layernorm_after;
    std::shared_ptr<Linear> q_proj, k_proj, v_proj, projection_layer, fc1, fc2;
    std::shared_ptr<RMSNorm> q_norm, k_norm;  // null without use_qk_norm
    at::Tensor lambda_1, lambda_2;            // [D] layer scale
  };

 private:
  // x [N, P+1, D] -> [N, P+1, D]; `layout`: one bidirectional segment per tile.
  at::Tensor layer_forward(const Layer& l, const at::Tensor& x, const attention::TokenLayout& layout) const;
  InternVisionConfig config_;
  HookedBlocks hooked_layers_;
  at::Tensor cls_token, patch_weight, patch_bias, position_embeddings;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::shared_ptr<LayerNorm> layernorm_;  // null with use_mean_pooling
};

}  // namespace mmsp::model
