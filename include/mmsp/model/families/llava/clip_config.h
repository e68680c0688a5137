// LLaVA's CLIP vision_config and its projector fields, typed and validated. Defaults
// are transformers' (CLIPVisionConfig, LlavaConfig) for a missing key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/model/config/config.h"

namespace mmsp::model {

// LLaVA's vision_config (model_type clip_vision_model). Defaults are CLIPVisionConfig's;
// llava-1.5 files set the ViT-L/14-336 values.
struct ClipVisionConfig {
  // transformer layers
  int64_t num_hidden_layers = 12;
  // width of the layers
  int64_t hidden_size = 768;
  // attention heads; must divide hidden_size
  int64_t num_attention_heads = 12;
  // MLP width
  int64_t intermediate_size = 3072;
  // MLP activation
  std::string hidden_act = "quick_gelu";
  // epsilon of every LayerNorm
  double layer_norm_eps = 1e-5;
  // pixel channels
  int64_t num_channels = 3;
  // side of the square input image, in pixels
  int64_t image_size = 224;
  // side of a square patch, in pixels; must divide image_size
  int64_t patch_size = 32;
  // CLIP's contrastive projection width (unused by LLaVA, kept for a faithful round trip)
  int64_t projection_dim = 512;

  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t num_patches() const { return patches_per_side() * patches_per_side(); }
};

// LLaVA's top-level fields: which encoder output feeds the projector, and the projector.
struct LlavaProjectorConfig {
  // encoder hidden state fed to the projector: index into [embeddings, layer 1, ..., layer L],
  // negative from the end (-2: the penultimate layer)
  int64_t vision_feature_layer = -2;
  // "default" drops the class token, "full" keeps it
  std::string vision_feature_select_strategy = "default";
  // activation between the projector's two linear layers
  std::string projector_hidden_act = "gelu";
  // the projector's linear layers carry biases
  bool multimodal_projector_bias = true;
  // placeholder tokens per image: (image_size / patch_size)^2, + 1 with "full"; a file that
  // sets image_seq_length must agree (transformers' 576 is llava-1.5's value)
  int64_t image_seq_length = 576;
};

ClipVisionConfig default_clip_vision_config();
// LLaVA without a vision_config: transformers builds CLIP ViT-L/14 at 336 px.
ClipVisionConfig default_llava_vision_config();

// Reads one vision_config object (missing keys keep the defaults); errors name
// "vision_config.<field>" and the value; the fields are checked against each other.
ClipVisionConfig parse_clip_vision_config(const nlohmann::json& vision);
// Reads the LLaVA fields of the top-level object and checks them against `vision`.
LlavaProjectorConfig parse_llava_projector_config(const nlohmann::json& config, const ClipVisionConfig& vision);

// The LLaVA family's part of a ModelConfig (ModelConfig::family_fields).
struct LlavaFields : FamilyFields {
  ClipVisionConfig vision;
  LlavaProjectorConfig projector;
};
// The config's CLIP tower and projector; null for a config of another family.
inline const ClipVisionConfig* clip_vision_of(const ModelConfig& c) { return family_field(c, &LlavaFields::vision); }
inline const LlavaProjectorConfig* llava_projector_of(const ModelConfig& c) {
  return family_field(c, &LlavaFields::projector);
}

}  // namespace mmsp::model
