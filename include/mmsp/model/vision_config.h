// The vision encoders' configs, typed and validated: the Qwen-VL family's patch encoder
// (one struct for Qwen2-VL, Qwen2.5-VL and Qwen3-VL, with each file's names mapped onto it)
// and LLaVA's CLIP encoder with its projector. Defaults are transformers' for a missing key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/model/model_family.h"
#include "mmsp/plan/model_conventions.h"

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

QwenVisionConfig default_qwen_vision_config(ModelFamily family);
ClipVisionConfig default_clip_vision_config();
// LLaVA without a vision_config: transformers builds CLIP ViT-L/14 at 336 px.
ClipVisionConfig default_llava_vision_config();

// Read one vision_config object (missing keys keep the defaults); errors name
// "vision_config.<field>" and the value. Each checks its own fields against each other.
QwenVisionConfig parse_qwen_vision_config(const nlohmann::json& vision, ModelFamily family);
ClipVisionConfig parse_clip_vision_config(const nlohmann::json& vision);
// Reads the LLaVA fields of the top-level object and checks them against `vision`.
LlavaProjectorConfig parse_llava_projector_config(const nlohmann::json& config,
                                                  const ClipVisionConfig& vision);

// Activations the model layer implements: silu, gelu, gelu_pytorch_tanh, quick_gelu, relu.
bool is_supported_activation(const std::string& name);

}  // namespace mmsp::model
