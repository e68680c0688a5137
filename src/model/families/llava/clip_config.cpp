// LLaVA's CLIP vision_config and projector fields; see clip_config.h.
#include "mmsp/model/families/llava/clip_config.h"

#include <cmath>

#include "config_parts.h"
#include "json_fields.h"
#include "mmsp/core/check.h"

namespace mmsp::model {

using config_parts::check_activation;
using json_fields::join;
using json_fields::JsonFields;

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
  config_parts::check_size_limits(f, {{"num_hidden_layers", v.num_hidden_layers, config_parts::kMaxLayers},
                                      {"hidden_size", v.hidden_size, config_parts::kMaxWidth},
                                      {"intermediate_size", v.intermediate_size, config_parts::kMaxWidth},
                                      {"num_attention_heads", v.num_attention_heads, config_parts::kMaxWidth}});
  v.hidden_act = f.string("hidden_act", v.hidden_act);
  check_activation(f, "hidden_act", v.hidden_act);
  v.layer_norm_eps = f.number("layer_norm_eps", v.layer_norm_eps);
  v.num_channels = f.integer("num_channels", v.num_channels);
  v.image_size = f.integer("image_size", v.image_size);
  v.patch_size = f.integer("patch_size", v.patch_size);
  v.projection_dim = f.integer("projection_dim", v.projection_dim);
  MMSP_CHECK(v.hidden_size % v.num_attention_heads == 0, f.name("num_attention_heads"), " (", v.num_attention_heads,
             ") must divide ", f.name("hidden_size"), " (", v.hidden_size, ")");
  MMSP_CHECK(v.image_size % v.patch_size == 0, f.name("patch_size"), " (", v.patch_size, ") must divide ",
             f.name("image_size"), " (", v.image_size, ")");
  return v;
}

LlavaProjectorConfig parse_llava_projector_config(const nlohmann::json& config, const ClipVisionConfig& vision) {
  LlavaProjectorConfig p;
  const JsonFields f(config, "");
  if (f.has("vision_feature_layer")) {
    MMSP_CHECK(!f.at("vision_feature_layer").is_array(), "vision_feature_layer ", f.at("vision_feature_layer").dump(),
               ": a list of layers is not supported; give one layer");
    p.vision_feature_layer = f.integer("vision_feature_layer", p.vision_feature_layer, INT64_MIN);
  }
  const int64_t layers = vision.num_hidden_layers;
  MMSP_CHECK(p.vision_feature_layer >= -(layers + 1) && p.vision_feature_layer <= layers, "vision_feature_layer (",
             p.vision_feature_layer, ") must be in [", -(layers + 1), ", ", layers,
             "]: vision_config.num_hidden_layers is ", layers, ", so there are ", layers + 1,
             " hidden states (embeddings, then each layer)");
  p.vision_feature_select_strategy = f.string("vision_feature_select_strategy", p.vision_feature_select_strategy);
  MMSP_CHECK(p.vision_feature_select_strategy == "default" || p.vision_feature_select_strategy == "full",
             "vision_feature_select_strategy \"", p.vision_feature_select_strategy,
             "\" is not supported; supported: default (drop the class token), full");
  p.projector_hidden_act = f.string("projector_hidden_act", p.projector_hidden_act);
  check_activation(f, "projector_hidden_act", p.projector_hidden_act);
  p.multimodal_projector_bias = f.boolean("multimodal_projector_bias", p.multimodal_projector_bias);
  const int64_t rows = vision.num_patches() + (p.vision_feature_select_strategy == "full" ? 1 : 0);
  p.image_seq_length = f.integer("image_seq_length", rows);
  MMSP_CHECK(p.image_seq_length == rows, "image_seq_length (", p.image_seq_length,
             ") must equal the rows the encoder yields per image: (image_size / patch_size)^2 = (", vision.image_size,
             " / ", vision.patch_size, ")^2 = ", vision.num_patches(),
             p.vision_feature_select_strategy == "full" ? ", + 1 class token" : "");
  return p;
}

}  // namespace mmsp::model
