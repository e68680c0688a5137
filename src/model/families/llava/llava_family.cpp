// The LLaVA family's registry entry; see llava_family.h. Reads the nested text_config,
// the CLIP vision_config and the projector fields, builds the LLaVA model (llava.h), and gives the
// processor's geometry (each image resized to image_size, normalised, whole) and the
// checkpoints' names.
#include "mmsp/model/families/llava/llava_family.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "config_parts.h"
#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/model/checkpoint_naming.h"
#include "mmsp/model/families/llava/clip_config.h"
#include "mmsp/model/families/llava/llava.h"

namespace mmsp::model {

namespace {

using json_fields::JsonFields;

// CLIPImageProcessor as llava-1.5 ships it: the shorter side resized to image_size (the
// longer one in proportion, truncated as transformers' get_resize_output_image_size
// does), the centre image_size square cut out, CLIP's normalisation.
class LlavaPixelGeometry : public PixelGeometry {
 public:
  LlavaPixelGeometry(const ClipVisionConfig& v, const LlavaProjectorConfig& p)
      : v_(v), class_row_(p.vision_feature_select_strategy == "full" ? 1 : 0) {}
  int64_t channels() const override { return v_.num_channels; }
  bool takes_videos() const override { return false; }
  const PixelNorm& norm() const override { return norm_; }
  int64_t fixed_side() const override { return v_.image_size; }
  int64_t side_unit() const override { return v_.patch_size; }

  plan::Grid grid_for(int64_t, int64_t, int64_t, const std::string&) const override { return grid(); }
  std::string grid_mismatch(const plan::Grid& g, int64_t, int64_t, int64_t, const std::string&) const override {
    if (g == grid()) return "";
    return detail::concat("but llava images of ", v_.image_size, " px have grid [1, ", grid()[1], ", ", grid()[2], "]");
  }
  std::pair<int64_t, int64_t> frame_size(const plan::Grid&, int64_t width, int64_t height) const override {
    const int64_t S = v_.image_size;
    if (width <= 0 || height <= 0) return {S, S};
    const int64_t shorter = std::min(width, height), longer = std::max(width, height);
    const auto scaled = static_cast<int64_t>(static_cast<double>(S * longer) / static_cast<double>(shorter));
    return width <= height ? std::pair<int64_t, int64_t>{S, scaled} : std::pair<int64_t, int64_t>{scaled, S};
  }
  int64_t placeholder_rows(const plan::Grid& g) const override { return class_row_ + g[0] * g[1] * g[2]; }
  std::vector<int64_t> item_shape(const plan::Grid&) const override { return row_shape(); }
  int64_t batch_rows(const plan::Grid&) const override { return 1; }
  std::vector<int64_t> row_shape() const override { return {v_.num_channels, v_.image_size, v_.image_size}; }
  std::string item_layout() const override { return "channels x image_size x image_size"; }
  at::Tensor item_pixels(const at::Tensor& frames) const override {
    MMSP_CHECK(frames.dim() == 4 && frames.size(0) == 1, "LLaVA takes one frame per image, got frames ",
               frames.sizes());
    // The centre square, its corner rounded down (transformers' center_crop).
    const int64_t S = v_.image_size, top = (frames.size(2) - S) / 2, left = (frames.size(3) - S) / 2;
    MMSP_CHECK(top >= 0 && left >= 0, "LLaVA frame ", frames.size(3), " x ", frames.size(2), " is smaller than ", S,
               " x ", S);
    return normalize_pixels(frames[0].slice(1, top, top + S).slice(2, left, left + S), 0, norm_).contiguous();
  }

 private:
  plan::Grid grid() const { return {1, v_.patches_per_side(), v_.patches_per_side()}; }
  ClipVisionConfig v_;
  PixelNorm norm_;  // OpenAI CLIP
  int64_t class_row_ = 0;
};

// LLaVA's decoder fields: transformers' LlamaConfig, its default text_config.
TextDialect llama_text_dialect() {
  TextDialect d;
  d.family = "llava";
  TextVariant v;
  TextConfig& t = v.defaults;
  t.model_type = "llama";
  t.vocab_size = 32000;
  t.hidden_size = 4096;
  t.intermediate_size = 11008;
  t.num_hidden_layers = 32;
  t.num_attention_heads = 32;
  t.num_key_value_heads = 32;
  t.head_dim = 128;
  t.rms_norm_eps = 1e-6;
  t.rope_theta = 10000.0;
  t.max_position_embeddings = 2048;
  t.qkv_bias = false;
  d.variants = {v};
  d.kv_heads_default_to_heads = true;
  d.rope_types = {"default"};
  d.rope_rule = "Llama decoders use plain RoPE (\"default\")";
  d.refused_rope_keys = {"factor", "mrope_section"};
  d.refused_rope_reason = "scaled or multimodal RoPE is not supported for llava";
  d.reads_mlp_bias = true;
  return d;
}

class LlavaFamily : public Family {
 public:
  const char* name() const override { return "llava"; }
  std::vector<std::string> model_types() const override { return {"llava"}; }

  VisionTokenWords token_words() const override { return {"<image>", "", "", ""}; }

  // Per patch (llava.cpp's layer_forward), in each layer up to the feature layer: the
  // layer's input and first norm's output, q, k, v, the attention's output, the residual
  // sum and the second norm's output (8D), the norms' statistics and the attention's
  // log-sum-exp (4 + H); fc1's output, the activation's output and (quick_gelu) its
  // sigmoid. Outside the layers: the pixels three times (the step's, the tower's
  // gathered copy and their patches in row order), the patch embedding, the position sum
  // and the pre-norm (3D), the projector's two hidden activations (2h).
  VisionMemoryShape vision_memory(const ModelConfig& c) const override {
    const ClipVisionConfig& v = *clip_vision_of(c);
    const LlavaProjectorConfig& p = *llava_projector_of(c);
    const int64_t D = v.hidden_size, I = v.intermediate_size, h = c.text.hidden_size;
    VisionMemoryShape s;
    s.blocks = p.vision_feature_layer < 0 ? v.num_hidden_layers + 1 + p.vision_feature_layer : p.vision_feature_layer;
    s.width = D;
    s.kept_per_block = 8 * D + 4 + v.num_attention_heads + (v.hidden_act == "quick_gelu" ? 3 : 2) * I;
    s.block_transient = 2 * I;
    s.kept_outside = 3 * D + 2 * h;
    s.pixels_per_token = 3 * v.num_channels * v.patch_size * v.patch_size;
    s.row_width = h;
    return s;
  }

  // llava-hf/llava-1.5-7b-hf: <image> = 32000, 1-D positions, no blocks, no merge, no video.
  plan::ModelConventions conventions(const nlohmann::json& config) const override {
    namespace fields = plan::conventions_fields;
    fields::check_object(config);
    plan::ModelConventions c;
    c.name = "llava";
    c.positions = plan::PositionKind::rope_1d;
    c.image_token_id = 32000;
    c.video_token_id = -1;
    c.vision_start_token_id = -1;
    c.vision_end_token_id = -1;
    c.spatial_merge_size = 1;
    // transformers renamed image_token_index to image_token_id; accept both.
    c.image_token_id = fields::token_id(config, "image_token_index", c.image_token_id);
    c.image_token_id = fields::token_id(config, "image_token_id", c.image_token_id);
    // "full" keeps the class token: 1 + patches placeholder rows per image.
    if (config.contains("vision_feature_select_strategy")) {
      const auto& strategy = config.at("vision_feature_select_strategy");
      MMSP_CHECK(strategy == "default" || strategy == "full", "config.json: vision_feature_select_strategy ",
                 strategy.dump(), " is not supported; supported: \"default\" (drop the class token), \"full\"");
      c.class_rows = strategy == "full" ? 1 : 0;
    }
    // The CLIP tower can encode one large image over the context group (its heads split
    // over the ranks): the planner needs their number.
    const nlohmann::json* vision = fields::object(config, "vision_config");
    c.vision_heads = (vision ? parse_clip_vision_config(*vision) : default_llava_vision_config()).num_attention_heads;
    return c;
  }

  void read_config(const nlohmann::json& config, ModelConfig& c) const override {
    const JsonFields top(config, "");
    static const nlohmann::json kEmpty = nlohmann::json::object();
    const nlohmann::json* nested = top.object("text_config");
    const nlohmann::json& text_json = nested ? *nested : kEmpty;
    const JsonFields text(text_json, "text_config.");
    c.text = parse_text_config(text_json, llama_text_dialect(), "text_config.");
    c.conventions = config_parts::read_conventions(*this, config);
    c.tie_word_embeddings = config_parts::read_tie(top, text);
    const nlohmann::json* vision = top.object("vision_config");
    auto fields = std::make_shared<LlavaFields>();
    fields->vision = vision ? parse_clip_vision_config(*vision) : default_llava_vision_config();
    fields->projector = parse_llava_projector_config(config, fields->vision);
    c.family_fields = fields;
    config_parts::check_token_ids(c, "image_token_index");  // the released files' name
  }

  std::shared_ptr<Vlm> build(const ModelConfig& c) const override { return build_llava(c); }

  std::shared_ptr<const PixelGeometry> geometry(const ModelConfig& c) const override {
    MMSP_ASSERT(clip_vision_of(c) && llava_projector_of(c));
    return std::make_shared<LlavaPixelGeometry>(*clip_vision_of(c), *llava_projector_of(c));
  }

  // The CLIP tower's names: llava-1.5-*-hf and mmsp vision_tower.vision_model.*;
  // transformers 4.52 to 4.57 model.vision_tower.vision_model.*; transformers 5 keeps
  // no CLIPVisionModel wrapper and writes vision_tower.{embeddings,pre_layrnorm,encoder,
  // post_layernorm}.* (model.vision_tower.* in memory). First match wins: the full
  // prefixes go before the shorter ones, and before the layout's generic pairs.
  hf::CheckpointNaming checkpoint_naming(const ModelConfig& c) const override {
    hf::CheckpointNaming naming = llava_layout_naming(c.tie_word_embeddings);
    const std::string tower = "vision_tower.vision_model.";
    naming.prefix_aliases.insert(
        naming.prefix_aliases.begin(),
        {{tower, tower}, {"model." + tower, tower}, {"model.vision_tower.", tower}, {"vision_tower.", tower}});
    return naming;
  }
};

}  // namespace

const Family& llava_family() {
  static const LlavaFamily family;
  return family;
}

}  // namespace mmsp::model
