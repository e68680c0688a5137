// InternVL's vision_config and top-level fields; see internvl_config.h. Follows
// transformers' InternVLVisionConfig and InternVLConfig, and refuses what the model
// does not build (a mask token, other feature layers or strategies, non-square tiles).
#include "mmsp/model/families/internvl/internvl_config.h"

#include <cmath>

#include "config_parts.h"
#include "json_fields.h"
#include "mmsp/core/check.h"

namespace mmsp::model {

using json_fields::JsonFields;

namespace {

// image_size / patch_size: an integer or a [height, width] pair with height == width.
int64_t square_side(const JsonFields& f, const std::string& key, int64_t fallback) {
  if (!f.has(key)) return fallback;
  if (!f.at(key).is_array()) return f.integer(key, fallback);
  const std::vector<int64_t> sides = f.integers(key, {}, 1);
  MMSP_CHECK(sides.size() == 2 && sides[0] == sides[1], f.name(key), " ", f.at(key).dump(),
             " must be one side or [side, side]: tiles and patches are square");
  return sides[0];
}

}  // namespace

int64_t InternVLProjectorConfig::scale() const { return static_cast<int64_t>(std::llround(1.0 / downsample_ratio)); }

InternVisionConfig parse_intern_vision_config(const nlohmann::json& vision) {
  InternVisionConfig v;
  const JsonFields f(vision, "vision_config.");
  const std::string type = f.string("model_type", "internvl_vision");
  MMSP_CHECK(type == "internvl_vision", f.name("model_type"), " \"", type,
             "\" is not supported for internvl; supported: internvl_vision");
  v.num_hidden_layers = f.integer("num_hidden_layers", v.num_hidden_layers);
  v.hidden_size = f.integer("hidden_size", v.hidden_size);
  v.num_attention_heads = f.integer("num_attention_heads", v.num_attention_heads);
  v.intermediate_size = f.integer("intermediate_size", v.intermediate_size);
  config_parts::check_size_limits(f, {{"num_hidden_layers", v.num_hidden_layers, config_parts::kMaxLayers},
                                      {"hidden_size", v.hidden_size, config_parts::kMaxWidth},
                                      {"intermediate_size", v.intermediate_size, config_parts::kMaxWidth},
                                      {"num_attention_heads", v.num_attention_heads, config_parts::kMaxWidth}});
  v.hidden_act = f.string("hidden_act", v.hidden_act);
  config_parts::check_activation(f, "hidden_act", v.hidden_act);
  v.attention_bias = f.boolean("attention_bias", v.attention_bias);
  v.use_qk_norm = f.boolean("use_qk_norm", v.use_qk_norm);
  v.norm_type = f.string("norm_type", v.norm_type);
  MMSP_CHECK(v.norm_type == "layer_norm" || v.norm_type == "rms_norm", f.name("norm_type"), " \"", v.norm_type,
             "\" is not supported; supported: layer_norm, rms_norm");
  v.layer_norm_eps = f.number("layer_norm_eps", v.layer_norm_eps);
  v.image_size = square_side(f, "image_size", v.image_size);
  v.patch_size = square_side(f, "patch_size", v.patch_size);
  v.num_channels = f.integer("num_channels", v.num_channels);
  MMSP_CHECK(v.num_channels <= 64, f.name("num_channels"), " ", v.num_channels,
             " is beyond what a vision tower uses: at most 64");
  v.layer_scale_init_value = f.number("layer_scale_init_value", v.layer_scale_init_value, true);
  v.use_mean_pooling = f.boolean("use_mean_pooling", v.use_mean_pooling);
  v.initializer_range = f.number("initializer_range", v.initializer_range, true);
  MMSP_CHECK(!f.boolean("use_mask_token", false), f.name("use_mask_token"),
             " is true; the mask token (masked image modelling) is not supported");
  MMSP_CHECK(f.boolean("use_absolute_position_embeddings", true), f.name("use_absolute_position_embeddings"),
             " is false; InternVL's tower is built with its learned position table only");
  MMSP_CHECK(v.hidden_size % v.num_attention_heads == 0, f.name("num_attention_heads"), " (", v.num_attention_heads,
             ") must divide ", f.name("hidden_size"), " (", v.hidden_size, ")");
  MMSP_CHECK(v.image_size % v.patch_size == 0, f.name("patch_size"), " (", v.patch_size, ") must divide ",
             f.name("image_size"), " (", v.image_size, ")");
  return v;
}

InternVLProjectorConfig parse_internvl_projector_config(const nlohmann::json& config,
                                                        const InternVisionConfig& vision) {
  InternVLProjectorConfig p;
  const JsonFields f(config, "");
  p.downsample_ratio = f.number("downsample_ratio", p.downsample_ratio);
  const double inverse = 1.0 / p.downsample_ratio;
  MMSP_CHECK(p.downsample_ratio <= 1 && std::fabs(inverse - std::round(inverse)) < 1e-6, "downsample_ratio (",
             p.downsample_ratio, ") must be 1/k for an integer k >= 1 ", "(pixel shuffle merges k×k patches)");
  const int64_t side = vision.patches_per_side(), k = p.scale();
  MMSP_CHECK(side % k == 0, "vision_config.image_size / patch_size = ", vision.image_size, " / ", vision.patch_size,
             " = ", side, " patches a side must divide by 1/downsample_ratio = ", k, " for the pixel shuffle");
  const int64_t rows = (side / k) * (side / k);
  p.image_seq_length = f.integer("image_seq_length", rows);
  MMSP_CHECK(p.image_seq_length == rows, "image_seq_length (", p.image_seq_length,
             ") must equal the rows a tile yields: (image_size / patch_size · downsample_ratio)² = (", side, " / ", k,
             ")² = ", rows);
  p.projector_hidden_act = f.string("projector_hidden_act", p.projector_hidden_act);
  config_parts::check_activation(f, "projector_hidden_act", p.projector_hidden_act);
  if (f.has("vision_feature_layer")) {
    MMSP_CHECK(!f.at("vision_feature_layer").is_array(), "vision_feature_layer ", f.at("vision_feature_layer").dump(),
               ": a list of layers is not supported");
    p.vision_feature_layer = f.integer("vision_feature_layer", p.vision_feature_layer, INT64_MIN);
  }
  MMSP_CHECK(p.vision_feature_layer == -1, "vision_feature_layer (", p.vision_feature_layer,
             ") is not supported; InternVL feeds the projector from the last layer (-1)");
  p.vision_feature_select_strategy = f.string("vision_feature_select_strategy", p.vision_feature_select_strategy);
  MMSP_CHECK(p.vision_feature_select_strategy == "default", "vision_feature_select_strategy \"",
             p.vision_feature_select_strategy,
             "\" is not supported for internvl; supported: default (the class token dropped, so the ",
             "rows form the square grid the pixel shuffle needs)");
  return p;
}

}  // namespace mmsp::model
