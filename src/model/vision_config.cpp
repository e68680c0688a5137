// Vision configs: transformers' defaults (Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig,
// Qwen3VLVisionConfig, CLIPVisionConfig, LlavaConfig) and the checks an encoder needs.
#include "mmsp/model/vision_config.h"

#include <cmath>

#include "json_fields.h"
#include "mmsp/core/check.h"

namespace mmsp::model {

using json_fields::join;
using json_fields::JsonFields;

bool is_supported_activation(const std::string& name) {
  return name == "silu" || name == "gelu" || name == "gelu_pytorch_tanh" ||
         name == "quick_gelu" || name == "relu";
}

namespace {

void check_activation(const JsonFields& f, const std::string& key, const std::string& value) {
  MMSP_CHECK(is_supported_activation(value), f.name(key), " \"", value,
             "\" is not supported; supported: silu, gelu, gelu_pytorch_tanh, quick_gelu, relu");
}

// Block indices: each in [0, depth), strictly increasing (the order the blocks run in).
void check_block_list(const JsonFields& f, const std::string& key,
                      const std::vector<int64_t>& blocks, int64_t depth) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    MMSP_CHECK(blocks[i] < depth, f.name(key), " ", join(blocks), " names block ", blocks[i],
               ", but vision_config.depth is ", depth, " (blocks 0..", depth - 1, ")");
    MMSP_CHECK(i == 0 || blocks[i] > blocks[i - 1], f.name(key), " ", join(blocks),
               " must be strictly increasing");
  }
}

}  // namespace

QwenVisionConfig default_qwen_vision_config(ModelFamily family) {
  QwenVisionConfig v;  // Qwen2VLVisionConfig
  switch (family) {
    case ModelFamily::qwen2_vl:
      break;
    case ModelFamily::qwen2_5_vl:  // Qwen2_5_VLVisionConfig (its hidden_size default is 3584)
      v.hidden_size = 3584;
      v.intermediate_size = 3420;
      v.hidden_act = "silu";
      v.window_size = 112;
      v.fullatt_block_indexes = {7, 15, 23, 31};
      break;
    case ModelFamily::qwen3_vl:  // Qwen3VLVisionConfig
      v.depth = 27;
      v.hidden_size = 1152;
      v.intermediate_size = 4304;
      v.hidden_act = "gelu_pytorch_tanh";
      v.patch_size = 16;
      v.num_position_embeddings = 2304;
      v.deepstack_visual_indexes = {8, 16, 24};
      break;
    case ModelFamily::llava:
    case ModelFamily::internvl:
      MMSP_CHECK(false, "no Qwen-VL vision encoder for model_type \"", to_string(family),
                 "\"");
  }
  return v;
}

QwenVisionConfig parse_qwen_vision_config(const nlohmann::json& vision, ModelFamily family) {
  QwenVisionConfig v = default_qwen_vision_config(family);
  const JsonFields f(vision, "vision_config.");
  v.depth = f.integer("depth", v.depth);
  std::string width_key = "hidden_size";
  if (family == ModelFamily::qwen2_vl) {
    // Qwen2-VL: embed_dim is the width, hidden_size the merger's output, MLP = width * ratio.
    width_key = "embed_dim";
    v.hidden_size = f.integer("embed_dim", v.hidden_size);
    v.out_hidden_size = f.integer("hidden_size", v.out_hidden_size);
    const double ratio = f.number("mlp_ratio", 4.0);
    const double mlp = static_cast<double>(v.hidden_size) * ratio;
    MMSP_CHECK(mlp >= 1 && mlp < 9.0e18, f.name("mlp_ratio"), " (", ratio, ") times ",
               f.name("embed_dim"), " (", v.hidden_size, ") must give an MLP width >= 1");
    v.intermediate_size = static_cast<int64_t>(mlp);  // Python's int(): truncates
  } else {
    v.hidden_size = f.integer("hidden_size", v.hidden_size);
    v.intermediate_size = f.integer("intermediate_size", v.intermediate_size);
    v.out_hidden_size = f.integer("out_hidden_size", v.out_hidden_size);
  }
  v.num_heads = f.integer("num_heads", v.num_heads);
  v.hidden_act = f.string("hidden_act", v.hidden_act);
  check_activation(f, "hidden_act", v.hidden_act);
  // transformers renamed in_chans (still in Qwen2/2.5-VL files) to in_channels.
  const int64_t chans = f.integer("in_chans", v.in_channels);
  v.in_channels = f.integer("in_channels", chans);
  MMSP_CHECK(v.in_channels == chans, f.name("in_channels"), " (", v.in_channels, ") and ",
             f.name("in_chans"), " (", chans, ") disagree");
  v.patch_size = f.integer("patch_size", v.patch_size);
  v.temporal_patch_size = f.integer("temporal_patch_size", v.temporal_patch_size);
  v.spatial_merge_size = f.integer("spatial_merge_size", v.spatial_merge_size);
  v.initializer_range = f.number("initializer_range", v.initializer_range, true);
  // Released models use 1-2 frames, 14-16 pixels and a merge of 2: these bounds keep
  // the patch embedding (channels × frames × patch²) from asking for gigabytes.
  const struct { const char* key; int64_t value, max; } limits[] = {
      {"temporal_patch_size", v.temporal_patch_size, 64}, {"patch_size", v.patch_size, 1024},
      {"spatial_merge_size", v.spatial_merge_size, 64}, {"in_channels", v.in_channels, 64}};
  for (const auto& l : limits)
    MMSP_CHECK(l.value <= l.max, f.name(l.key), " ", l.value, " is beyond what a vision tower uses: at most ", l.max);
  const int64_t patch_row = v.patch_row();  // the factors are bounded above: no overflow
  MMSP_CHECK(patch_row <= (int64_t{1} << 22), f.name("in_channels"), " × ", f.name("temporal_patch_size"), " × ",
             f.name("patch_size"), "² = ", patch_row, " values per patch is beyond 4194304");

  MMSP_CHECK(v.hidden_size % v.num_heads == 0, f.name("num_heads"), " (", v.num_heads,
             ") must divide ", f.name(width_key), " (", v.hidden_size, ")");
  // 2-D rotary: half of each head's rotary frequencies index rows, half columns.
  MMSP_CHECK(v.head_dim() % 4 == 0, "vision head size ", f.name(width_key), " / ",
             f.name("num_heads"), " = ", v.hidden_size, " / ", v.num_heads, " = ", v.head_dim(),
             " must be a multiple of 4 for the 2-D rotary embedding");

  if (family == ModelFamily::qwen2_5_vl) {
    v.window_size = f.integer("window_size", v.window_size);
    const int64_t unit = v.patch_size * v.spatial_merge_size;
    MMSP_CHECK(v.window_size % unit == 0, f.name("window_size"), " (", v.window_size,
               ") must be a multiple of patch_size * spatial_merge_size (", v.patch_size, " * ",
               v.spatial_merge_size, " = ", unit, ")");
    v.fullatt_block_indexes = f.integers("fullatt_block_indexes", v.fullatt_block_indexes);
    check_block_list(f, "fullatt_block_indexes", v.fullatt_block_indexes, v.depth);
  }
  if (family == ModelFamily::qwen3_vl) {
    v.num_position_embeddings = f.integer("num_position_embeddings", v.num_position_embeddings);
    const auto side = static_cast<int64_t>(std::llround(std::sqrt(
        static_cast<double>(v.num_position_embeddings))));
    MMSP_CHECK(side * side == v.num_position_embeddings, f.name("num_position_embeddings"), " (",
               v.num_position_embeddings, ") must be a square: the table is a grid interpolated ",
               "to each image");
    v.deepstack_visual_indexes = f.integers("deepstack_visual_indexes", v.deepstack_visual_indexes);
    check_block_list(f, "deepstack_visual_indexes", v.deepstack_visual_indexes, v.depth);
  }
  return v;
}

ClipVisionConfig default_clip_vision_config() { return ClipVisionConfig{}; }

ClipVisionConfig default_llava_vision_config() {
  ClipVisionConfig v;  // what LlavaConfig builds when the file has no vision_config
  v.num_hidden_layers = 24;
  v.hidden_size = 1024;
  v.num_attention_heads = 16;
  v.intermediate_size = 4096;
  v.image_size = 336;
  v.patch_size = 14;
  v.projection_dim = 768;
  return v;
}

ClipVisionConfig parse_clip_vision_config(const nlohmann::json& vision) {
  ClipVisionConfig v = default_clip_vision_config();
  const JsonFields f(vision, "vision_config.");
  const std::string type = f.string("model_type", "clip_vision_model");
  MMSP_CHECK(type == "clip_vision_model", f.name("model_type"), " \"", type,
             "\" is not supported for llava; supported: clip_vision_model");
  v.num_hidden_layers = f.integer("num_hidden_layers", v.num_hidden_layers);
  v.hidden_size = f.integer("hidden_size", v.hidden_size);
  v.num_attention_heads = f.integer("num_attention_heads", v.num_attention_heads);
  v.intermediate_size = f.integer("intermediate_size", v.intermediate_size);
  v.hidden_act = f.string("hidden_act", v.hidden_act);
  check_activation(f, "hidden_act", v.hidden_act);
  v.layer_norm_eps = f.number("layer_norm_eps", v.layer_norm_eps);
  v.num_channels = f.integer("num_channels", v.num_channels);
  v.image_size = f.integer("image_size", v.image_size);
  v.patch_size = f.integer("patch_size", v.patch_size);
  v.projection_dim = f.integer("projection_dim", v.projection_dim);
  MMSP_CHECK(v.hidden_size % v.num_attention_heads == 0, f.name("num_attention_heads"), " (",
             v.num_attention_heads, ") must divide ", f.name("hidden_size"), " (", v.hidden_size,
             ")");
  MMSP_CHECK(v.image_size % v.patch_size == 0, f.name("patch_size"), " (", v.patch_size,
             ") must divide ", f.name("image_size"), " (", v.image_size, ")");
  return v;
}

LlavaProjectorConfig parse_llava_projector_config(const nlohmann::json& config,
                                                  const ClipVisionConfig& vision) {
  LlavaProjectorConfig p;
  const JsonFields f(config, "");
  if (f.has("vision_feature_layer")) {
    MMSP_CHECK(!f.at("vision_feature_layer").is_array(),
               "vision_feature_layer ", f.at("vision_feature_layer").dump(),
               ": a list of layers is not supported; give one layer");
    p.vision_feature_layer = f.integer("vision_feature_layer", p.vision_feature_layer,
                                       INT64_MIN);
  }
  const int64_t layers = vision.num_hidden_layers;
  MMSP_CHECK(p.vision_feature_layer >= -(layers + 1) && p.vision_feature_layer <= layers,
             "vision_feature_layer (", p.vision_feature_layer, ") must be in [", -(layers + 1),
             ", ", layers, "]: vision_config.num_hidden_layers is ", layers,
             ", so there are ", layers + 1, " hidden states (embeddings, then each layer)");
  p.vision_feature_select_strategy =
      f.string("vision_feature_select_strategy", p.vision_feature_select_strategy);
  MMSP_CHECK(p.vision_feature_select_strategy == "default" ||
                 p.vision_feature_select_strategy == "full",
             "vision_feature_select_strategy \"", p.vision_feature_select_strategy,
             "\" is not supported; supported: default (drop the class token), full");
  p.projector_hidden_act = f.string("projector_hidden_act", p.projector_hidden_act);
  check_activation(f, "projector_hidden_act", p.projector_hidden_act);
  p.multimodal_projector_bias = f.boolean("multimodal_projector_bias", p.multimodal_projector_bias);
  const int64_t rows = vision.num_patches() + (p.vision_feature_select_strategy == "full" ? 1 : 0);
  p.image_seq_length = f.integer("image_seq_length", rows);
  MMSP_CHECK(p.image_seq_length == rows, "image_seq_length (", p.image_seq_length,
             ") must equal the rows the encoder yields per image: (image_size / patch_size)^2 = (",
             vision.image_size, " / ", vision.patch_size, ")^2 = ", vision.num_patches(),
             p.vision_feature_select_strategy == "full" ? ", + 1 class token" : "");
  return p;
}

}  // namespace mmsp::model
