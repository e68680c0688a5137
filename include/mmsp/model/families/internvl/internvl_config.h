// InternVL's own config fields (the Hugging Face `internvl` format of InternVL3 / 3.5):
// the InternViT vision_config and the top-level fields that join it to the decoder
// (downsample_ratio, image_seq_length, the projector's activation, which features feed
// it). Defaults are transformers' (InternVLVisionConfig, InternVLConfig) for a missing
// key. The decoder's text_config (qwen2 or qwen3) is parse_text_config's business.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/model/config/config.h"

namespace mmsp::model {

// vision_config of model_type internvl_vision (InternViT-300M-448px-V2.5 by default).
struct InternVisionConfig {
  // transformer layers
  int64_t num_hidden_layers = 24;
  // width of the layers
  int64_t hidden_size = 1024;
  // attention heads; must divide hidden_size
  int64_t num_attention_heads = 16;
  // MLP width
  int64_t intermediate_size = 4096;
  // MLP activation
  std::string hidden_act = "gelu";
  // q/k/v projections carry a bias (InternViT-300M: true; 6B: false)
  bool attention_bias = false;
  // RMSNorm over the whole query and key (width hidden_size, eps 1e-6) before the heads split
  bool use_qk_norm = false;
  // "layer_norm" or "rms_norm": the norms before attention and before the MLP
  std::string norm_type = "layer_norm";
  // epsilon of those norms (and of the final LayerNorm)
  double layer_norm_eps = 1e-6;
  // side of a square tile, in pixels (image_size may be given as [side, side])
  int64_t image_size = 448;
  // side of a square patch, in pixels; must divide image_size
  int64_t patch_size = 14;
  // pixel channels
  int64_t num_channels = 3;
  // initial value of the layer-scale vectors lambda_1, lambda_2
  double layer_scale_init_value = 0.1;
  // true: no final LayerNorm (the released models); false: vision_tower.layernorm after the last layer
  bool use_mean_pooling = true;
  // std of the normal initialisation of weights trained from scratch
  double initializer_range = 0.02;

  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// InternVLConfig's top-level fields besides the sub-configs and token ids.
struct InternVLProjectorConfig {
  // pixel shuffle: each (1/ratio)² block of patches becomes one row (0.5: 2×2 → 1)
  double downsample_ratio = 0.5;
  // placeholder tokens per tile: (image_size / patch_size · downsample_ratio)²
  int64_t image_seq_length = 256;
  // activation between the projector's two linear layers
  std::string projector_hidden_act = "gelu";
  // the vision features fed to the projector: -1, the last layer (the only one transformers reads)
  int64_t vision_feature_layer = -1;
  // "default": the class token is dropped (the only strategy whose rows form a square grid)
  std::string vision_feature_select_strategy = "default";

  // patches merged per side: 1 / downsample_ratio
  int64_t scale() const;
};

// Reads vision_config (missing keys keep the defaults); errors name "vision_config.<field>".
InternVisionConfig parse_intern_vision_config(const nlohmann::json& vision);
// Reads the top-level fields and checks them against `vision`: the tile's patch grid must
// divide by 1/downsample_ratio and image_seq_length must equal the rows per tile.
InternVLProjectorConfig parse_internvl_projector_config(const nlohmann::json& config, const InternVisionConfig& vision);

// The InternVL family's part of a ModelConfig (ModelConfig::family_fields).
struct InternVLFields : FamilyFields {
  InternVisionConfig vision;
  InternVLProjectorConfig projector;
};
// The config's InternViT tower and projector; null for a config of another family.
inline const InternVisionConfig* intern_vision_of(const ModelConfig& c) {
  return family_field(c, &InternVLFields::vision);
}
inline const InternVLProjectorConfig* internvl_projector_of(const ModelConfig& c) {
  return family_field(c, &InternVLFields::projector);
}

}  // namespace mmsp::model
