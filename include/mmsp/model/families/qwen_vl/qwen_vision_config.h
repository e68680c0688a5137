// The Qwen-VL family's vision_config, typed and validated: one struct for Qwen2-VL,
// Qwen2.5-VL and Qwen3-VL (and Qwen3.5's tower), with each file's names mapped onto it.
// Defaults are transformers' (Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig,
// Qwen3VLVisionConfig) for a missing key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/model/config/config.h"

#include "mmsp/model/families/qwen_vl/qwen_variant.h"

namespace mmsp::model {

// Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision_config. Defaults below are Qwen2-VL's; see
// default_qwen_vision_config for the others.
struct QwenVisionConfig {
  // transformer blocks
  int64_t depth = 32;
  // width of the blocks (Qwen2-VL calls it embed_dim; Qwen2.5/3-VL hidden_size)
  int64_t hidden_size = 1280;
  // attention heads per block; must divide hidden_size
  int64_t num_heads = 16;
  // MLP width (Qwen2-VL: embed_dim * mlp_ratio; Qwen2.5/3-VL: intermediate_size)
  int64_t intermediate_size = 5120;
  // MLP activation: "quick_gelu" (Qwen2-VL), "silu" (Qwen2.5-VL, gated), "gelu_pytorch_tanh" (Qwen3-VL)
  std::string hidden_act = "quick_gelu";
  // pixel channels (in_channels; Qwen2-VL files say in_chans)
  int64_t in_channels = 3;
  // side of a square patch, in pixels
  int64_t patch_size = 14;
  // frames per patch (an image is repeated to fill them)
  int64_t temporal_patch_size = 2;
  // patches merged per side into one LLM token (spatial_merge_size^2 patches per token)
  int64_t spatial_merge_size = 2;
  // width of the merger's output, which must equal the decoder's hidden_size
  // (Qwen2-VL calls it vision_config.hidden_size; Qwen2.5/3-VL out_hidden_size)
  int64_t out_hidden_size = 3584;
  // Qwen2.5-VL: side of the attention window in pixels (windowed blocks)
  int64_t window_size = 0;
  // Qwen2.5-VL: blocks that attend over the whole frame instead of windows
  std::vector<int64_t> fullatt_block_indexes;
  // Qwen3-VL: entries of the learned position table (a square grid, interpolated per image)
  int64_t num_position_embeddings = 0;
  // Qwen3-VL: blocks whose output feeds a deepstack merger; merger k adds into decoder layer k
  std::vector<int64_t> deepstack_visual_indexes;
  // std of the normal initialisation of weights trained from scratch
  double initializer_range = 0.02;

  int64_t head_dim() const { return hidden_size / num_heads; }
  // Values in one row of pixel_values: a patch of every channel over temporal_patch_size frames
  int64_t patch_row() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
};

QwenVisionConfig default_qwen_vision_config(QwenVariant variant);

// Reads one vision_config object (missing keys keep the defaults); errors name
// "vision_config.<field>" and the value; the fields are checked against each other.
QwenVisionConfig parse_qwen_vision_config(const nlohmann::json& vision, QwenVariant variant);

// The Qwen-VL family's part of a ModelConfig (ModelConfig::family_fields).
struct QwenFields : FamilyFields {
  QwenVisionConfig vision;
};
// The config's Qwen vision encoder; null for a config of another family.
inline const QwenVisionConfig* qwen_vision_of(const ModelConfig& c) { return family_field(c, &QwenFields::vision); }

}  // namespace mmsp::model
