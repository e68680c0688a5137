// The Qwen-VL family's registry entry; see qwen_vl_family.h. Reads the config (decoder
// fields at the top for Qwen2/2.5-VL, nested for Qwen3-VL; Qwen3.5's hybrid decoder and
// its Qwen3-VL tower without deepstack), builds the Qwen-VL model (qwen_vl.h), and gives the processor's
// geometry (qwen_patches.h) and the checkpoints' names.
#include "mmsp/model/families/qwen_vl/qwen_vl_family.h"

#include <nlohmann/json.hpp>

#include "config_parts.h"
#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/model/families/qwen_vl/qwen_patches.h"
#include "mmsp/model/families/qwen_vl/qwen_variant.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/families/qwen_vl/qwen_vl.h"

namespace mmsp::model {

namespace {

using json_fields::join;
using json_fields::JsonFields;

// Qwen3.5's hybrid decoder (Gated DeltaNet and gated attention), dense or mixture of experts.
bool hybrid(const std::string& model_type) { return model_type == "qwen3_5" || model_type == "qwen3_5_moe"; }

// Qwen3VLMoeTextConfig's defaults: Qwen3-VL's decoder with 24 layers of 60 experts, 4 a token.
TextVariant qwen3_vl_moe_text() {
  TextVariant v;
  TextConfig& t = v.defaults;
  t.model_type = "qwen3_vl_moe_text";
  t.vocab_size = 151936;
  t.hidden_size = 2048;
  t.intermediate_size = 5632;
  t.num_hidden_layers = 24;
  t.num_attention_heads = 16;
  t.num_key_value_heads = 16;
  t.rms_norm_eps = 1e-6;
  t.rope_theta = 500000.0;
  t.max_position_embeddings = 128000;
  t.qkv_bias = false;
  t.qk_norm = true;
  return v;  // head_dim: hidden_size / num_attention_heads unless given
}

// The decoder fields of a Qwen-VL config: transformers' Qwen2VLTextConfig (TextConfig's own
// defaults), Qwen2_5_VLTextConfig (the same numbers), Qwen3VLTextConfig or Qwen3VLMoeTextConfig.
TextDialect qwen_text_dialect(QwenVariant variant, bool moe) {
  TextDialect d;
  d.family = moe ? "qwen3_vl_moe" : to_string(variant);
  d.rope_types = {"default", "mrope"};
  d.rope_rule = "Qwen-VL decoders use \"mrope\" or \"default\"";
  TextVariant v;
  if (moe) {
    v = qwen3_vl_moe_text();
  } else if (variant == QwenVariant::qwen3_vl) {
    TextConfig& t = v.defaults;
    t.model_type = "qwen3_vl_text";
    t.vocab_size = 151936;
    t.hidden_size = 4096;
    t.intermediate_size = 22016;
    t.num_hidden_layers = 32;
    t.num_attention_heads = 32;
    t.num_key_value_heads = 32;
    t.head_dim = 128;
    t.rms_norm_eps = 1e-6;
    t.rope_theta = 5000000.0;
    t.max_position_embeddings = 128000;
    t.qkv_bias = false;
    t.qk_norm = true;
    v.head_dim_fixed = true;
  } else {
    if (variant == QwenVariant::qwen2_5_vl) v.defaults.model_type = "qwen2_5_vl_text";
    v.qwen2_attention = true;
  }
  d.variants = {v};
  return d;
}

// The released values (Qwen2-VL-7B-Instruct, Qwen2.5-VL-7B-Instruct, Qwen3-VL); Qwen3.5
// plans as Qwen3-VL with its own token ids and mRoPE sections (Qwen3_5Config's defaults).
plan::ModelConventions released_conventions(const std::string& model_type) {
  const QwenVariant variant = qwen_variant_of(model_type);
  plan::ModelConventions c;  // 3-D mRoPE, Qwen's token ids, merge 2
  c.name = to_string(variant);
  switch (variant) {
    case QwenVariant::qwen2_vl:
      c.mrope_section = {16, 24, 24};
      c.tokens_per_second = 1.0;  // unused: Qwen2-VL's t index is the frame
      break;
    case QwenVariant::qwen2_5_vl:  // vision_config.tokens_per_second = 2
      c.mrope_section = {16, 24, 24};
      c.tokens_per_second = 2.0;
      c.video_time_scaled = true;
      break;
    default:  // Qwen3-VL: interleaved mRoPE, text_config.rope_scaling; each frame its own block
      c.mrope_section = {24, 20, 20};
      c.mrope_interleaved = true;
      c.tokens_per_second = 1.0;  // unused: timestamps are text
      c.frames_as_blocks = true;
      break;
  }
  if (model_type == "qwen3_5" || model_type == "qwen3_5_moe") {
    c.image_token_id = 248056;
    c.video_token_id = 248057;
    c.vision_start_token_id = 248053;
    c.vision_end_token_id = 248054;
    c.mrope_section = {11, 11, 10};
  }
  return c;
}

// Where mrope_section came from, for error messages; empty when the family default applied.
std::string rope_field(const JsonFields& text) {
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (text.has(key) && text.at(key).is_object() && text.at(key).contains("mrope_section"))
      return text.name(key) + ".mrope_section";
  return "";
}

void check_mrope(const ModelConfig& c, const JsonFields& text) {
  const auto& s = c.conventions.mrope_section;
  int64_t sum = 0;
  const bool overflow = __builtin_add_overflow(s[0], s[1], &sum) || __builtin_add_overflow(sum, s[2], &sum);
  const std::string field = rope_field(text);
  const bool partial = c.text.rotary_dim() != c.text.head_dim;
  MMSP_CHECK(!overflow && sum == c.text.rotary_dim() / 2,
             field.empty()
                 ? text.name("rope_scaling.mrope_section") + " (not set; default " + join({s[0], s[1], s[2]}) + ")"
                 : field + " " + join({s[0], s[1], s[2]}),
             " sums to ", overflow ? std::string("more than 2^63") : std::to_string(sum),
             partial ? " but must be the rotary channels / 2 = int(head_dim · partial_rotary_factor) / 2 = " +
                           std::to_string(c.text.rotary_dim()) + " / 2"
                     : " but must be head_dim / 2 = " + std::to_string(c.text.head_dim) + " / 2",
             " (t, h and w share the head's rotary frequencies)");
  const bool interleave = qwen_variant_of(c) == QwenVariant::qwen3_vl;
  MMSP_CHECK(c.conventions.mrope_interleaved == interleave, text.name("rope_scaling"), ".mrope_interleaved is ",
             c.conventions.mrope_interleaved ? "true" : "false", ", but ", c.model_type, " always ",
             interleave ? "interleaves" : "splits", " the t/h/w frequencies",
             interleave ? "" : " into contiguous sections");
}

// Qwen3.5's vision tower is Qwen3-VL's without deepstack mergers, its rotary base fixed
// at 10000; the copy returned says so to the Qwen-VL vision parser.
nlohmann::json qwen3_5_vision(const nlohmann::json* vision) {
  nlohmann::json v = vision ? *vision : nlohmann::json::object();
  const JsonFields f(v, "vision_config.");
  const std::string type = f.string("model_type", "qwen3_5_vision");
  MMSP_CHECK(type == "qwen3_5_vision" || type == "qwen3_5" || type == "qwen3_5_moe_vision" || type == "qwen3_5_moe",
             f.name("model_type"), " \"", type,
             "\" is not supported for qwen3_5; expected \"qwen3_5_vision\" (\"qwen3_5_moe_vision\" for qwen3_5_moe)");
  const std::vector<int64_t> deepstack = f.integers("deepstack_visual_indexes", {});
  MMSP_CHECK(deepstack.empty(), f.name("deepstack_visual_indexes"), " ", join(deepstack),
             " must be empty: Qwen3.5's vision tower has no deepstack mergers");
  if (const nlohmann::json* rope = f.object("rope_parameters")) {
    const JsonFields r(*rope, f.name("rope_parameters."));
    const std::string rope_type = r.string("rope_type", "axial");
    MMSP_CHECK(rope_type == "axial" || rope_type == "default", r.name("rope_type"), " \"", rope_type,
               "\" is not supported; the vision tower's 2-D rotary is \"axial\"");
    const double theta = r.number("rope_theta", 10000.0);
    MMSP_CHECK(theta == 10000.0, r.name("rope_theta"), " (", theta,
               ") is not supported; the vision rotary base is 10000");
  }
  v["deepstack_visual_indexes"] = nlohmann::json::array();
  return v;
}

// The Qwen2-VL image processor: frames resized to the grid, patch rows per merge window.
class QwenPixelGeometry : public PixelGeometry {
 public:
  QwenPixelGeometry(const QwenVisionConfig& v, const plan::ModelConventions& c, QwenVariant variant) : v_(v) {
    takes_videos_ = c.supports_video();
    // OpenAI CLIP's values (Qwen2-VL, Qwen2.5-VL), 0.5 / 0.5 for Qwen3-VL and Qwen3.5
    // (their preprocessor_config.json).
    if (variant == QwenVariant::qwen3_vl) norm_.mean = norm_.std = {0.5, 0.5, 0.5};
  }
  int64_t channels() const override { return v_.in_channels; }
  bool takes_videos() const override { return takes_videos_; }
  const PixelNorm& norm() const override { return norm_; }
  int64_t fixed_side() const override { return 0; }
  int64_t side_unit() const override { return v_.patch_size * v_.spatial_merge_size; }

  plan::Grid grid_for(int64_t frames, int64_t width, int64_t height, const std::string& what) const override {
    const int64_t unit = side_unit();
    MMSP_CHECK(width % unit == 0 && height % unit == 0 && width > 0 && height > 0, what, " is ", width, " x ", height,
               " pixels (W x H), not a multiple of patch_size * spatial_merge_size = ", unit, " on each side");
    return {temporal_patches(frames), height / v_.patch_size, width / v_.patch_size};
  }
  std::string grid_mismatch(const plan::Grid& g, int64_t frames, int64_t, int64_t,
                            const std::string& what) const override {
    if (g[0] == temporal_patches(frames)) return "";
    return detail::concat("has t = ", g[0], " but ", what, " has ", frames, " frame(s), which make ",
                          temporal_patches(frames), " temporal patch(es) of ", v_.temporal_patch_size);
  }
  std::pair<int64_t, int64_t> frame_size(const plan::Grid& g, int64_t, int64_t) const override {
    return {g[2] * v_.patch_size, g[1] * v_.patch_size};
  }
  int64_t placeholder_rows(const plan::Grid& g) const override {
    const int64_t m = v_.spatial_merge_size;
    return g[0] * (g[1] / m) * (g[2] / m);
  }
  std::vector<int64_t> item_shape(const plan::Grid& g) const override { return {batch_rows(g), row_shape()[0]}; }
  int64_t batch_rows(const plan::Grid& g) const override { return g[0] * g[1] * g[2]; }
  std::vector<int64_t> row_shape() const override { return {v_.patch_row()}; }
  std::string item_layout() const override { return "patches x channels*temporal_patch_size*patch_size^2"; }
  at::Tensor item_pixels(const at::Tensor& frames) const override { return qwen_patches(frames, v_, norm_).rows; }
  at::Tensor video_pixels(const at::Tensor& frames) const override {
    return qwen_video_patches(frames, v_, norm_).rows;
  }
  int64_t video_frames_per_group() const override { return v_.temporal_patch_size; }
  int64_t video_rows_per_group(const plan::Grid& g) const override { return g[1] * g[2]; }

 private:
  int64_t temporal_patches(int64_t frames) const {
    return (frames + v_.temporal_patch_size - 1) / v_.temporal_patch_size;
  }
  QwenVisionConfig v_;
  PixelNorm norm_;
  bool takes_videos_ = true;
};

class QwenVLFamily : public Family {
 public:
  const char* name() const override { return "qwen_vl"; }
  std::vector<std::string> model_types() const override {
    return {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_vl_moe", "qwen3_5_moe"};
  }

  VisionTokenWords token_words() const override {
    return {"<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"};
  }

  // visual.blocks.<i> (Qwen2/2.5-VL) and model.visual.blocks.<i> (Qwen3-VL, Qwen3.5)

  // Per patch (qwen_vision.cpp's block_forward): the block's input and its first norm's
  // output, qkv (3D), the two rotated halves and q, k rotated (4D), the attention's
  // output and the residual sum, the second norm's output (12D); the MLP's fc1 output,
  // the activation's output and (quick_gelu) its sigmoid, or Qwen2.5-VL's gate, up, SiLU
  // and product (4I) with its RMS norms' normalised inputs (2D). Outside the blocks: the
  // patch embedding (D), the rotary tables (2·head_dim), Qwen2.5-VL's window order (D),
  // Qwen3-VL's interpolated positions (3D), and each merger's norm, fc1 and GELU (4D).
  VisionMemoryShape vision_memory(const ModelConfig& c) const override {
    const QwenVisionConfig& v = *qwen_vision_of(c);
    const QwenVariant variant = qwen_variant_of(c);
    const bool gated = variant == QwenVariant::qwen2_5_vl, qwen3 = !gated && variant != QwenVariant::qwen2_vl;
    const int64_t D = v.hidden_size, I = v.intermediate_size;
    const int64_t levels = static_cast<int64_t>(v.deepstack_visual_indexes.size());
    VisionMemoryShape s;
    s.blocks = v.depth;
    s.width = D;
    s.kept_per_block = 12 * D + (gated ? 2 * D + 4 * I : (v.hidden_act == "quick_gelu" ? 3 : 2) * I);
    s.block_transient = (gated ? 3 : 2) * I;
    s.kept_outside = D + 2 * v.head_dim() + (gated ? D : 0) + (qwen3 ? 3 * D : 0) + 4 * D * (1 + levels);
    s.pixels_per_token = 2 * v.patch_row();  // the step's pixels and the tower's gathered copy
    s.row_width = c.text.hidden_size * (1 + levels);
    return s;
  }

  plan::ModelConventions conventions(const nlohmann::json& config) const override {
    namespace fields = plan::conventions_fields;
    fields::check_object(config);
    plan::ModelConventions c = released_conventions(config.at("model_type").get<std::string>());
    c.image_token_id = fields::token_id(config, "image_token_id", c.image_token_id);
    c.video_token_id = fields::token_id(config, "video_token_id", c.video_token_id);
    c.vision_start_token_id = fields::token_id(config, "vision_start_token_id", c.vision_start_token_id);
    c.vision_end_token_id = fields::token_id(config, "vision_end_token_id", c.vision_end_token_id);
    if (const nlohmann::json* vision = fields::object(config, "vision_config")) {
      if (vision->contains("spatial_merge_size")) {
        const auto& m = vision->at("spatial_merge_size");
        MMSP_CHECK(m.is_number_integer() && m.get<int64_t>() >= 1,
                   "config.json: vision_config.spatial_merge_size must be an integer >= 1, got ", m.dump());
        c.spatial_merge_size = m.get<int64_t>();
      }
      if (c.scales_video_time() && vision->contains("tokens_per_second")) {
        const auto& t = vision->at("tokens_per_second");
        MMSP_CHECK(t.is_number() && t.get<double>() >= 0 && t.get<double>() <= plan::kMaxTokensPerSecond,
                   "config.json: vision_config.tokens_per_second must be a number in [0, ", plan::kMaxTokensPerSecond,
                   "], got ", t.dump(), " (it scales video positions)");
        c.tokens_per_second = t.get<double>();
      }
    }
    fields::read_mrope(config, c);
    fields::check_distinct_token_ids(c);
    // The tower can split one item over the context group (vision-tower SP) when its heads
    // divide by the group: the planner needs their number.
    const nlohmann::json* vision = fields::object(config, "vision_config");
    static const nlohmann::json kNone = nlohmann::json::object();
    const QwenVariant variant = qwen_variant_of(config.at("model_type").get<std::string>());
    c.vision_heads = hybrid(config.at("model_type").get<std::string>())
                         ? parse_qwen_vision_config(qwen3_5_vision(vision), variant).num_heads
                         : parse_qwen_vision_config(vision ? *vision : kNone, variant).num_heads;
    return c;
  }

  void read_config(const nlohmann::json& config, ModelConfig& c) const override {
    const QwenVariant variant = qwen_variant_of(c.model_type);
    const JsonFields top(config, "");
    // Qwen2/2.5-VL files keep decoder fields at the top (newer transformers nest them in
    // text_config, which then wins, as in transformers); Qwen3-VL always nests them.
    const nlohmann::json* nested = top.object("text_config");
    const bool qwen2 = variant == QwenVariant::qwen2_vl || variant == QwenVariant::qwen2_5_vl;
    static const nlohmann::json kEmpty = nlohmann::json::object();
    const nlohmann::json& text_json = nested ? *nested : qwen2 ? config : kEmpty;
    const std::string text_prefix = nested || !qwen2 ? "text_config." : "";
    const JsonFields text(text_json, text_prefix);
    const bool hybrid = model::hybrid(c.model_type), moe = c.model_type == "qwen3_vl_moe";
    c.text = hybrid ? parse_hybrid_text_config(text_json, "text_config.", c.model_type == "qwen3_5_moe")
                    : parse_text_config(text_json, qwen_text_dialect(variant, moe), text_prefix);
    // Qwen3VLMoeTextConfig: 60 experts, 4 a token, width 1408, no shared expert; the
    // released files fuse each layer's experts.
    if (moe)
      c.text.moe = parse_moe_config(text_json, "text_config.", {60, 4, 1408, 0, ExpertLayout::fused, true},
                                    c.text.num_hidden_layers);
    c.conventions = config_parts::read_conventions(*this, config);
    // transformers ties by the top-level config's key; Qwen3VLMoeTextConfig defaults its own
    // to true and transformers 5 writes it so beside a top-level false: the top wins there.
    const bool top_tie = (moe || c.model_type == "qwen3_5_moe") && config.contains("tie_word_embeddings");
    c.tie_word_embeddings = top_tie ? top.boolean("tie_word_embeddings", false) : config_parts::read_tie(top, text);

    const nlohmann::json* vision = top.object("vision_config");
    auto fields = std::make_shared<QwenFields>();
    fields->vision = hybrid ? parse_qwen_vision_config(qwen3_5_vision(vision), variant)
                            : parse_qwen_vision_config(vision ? *vision : kEmpty, variant);
    c.family_fields = fields;
    const QwenVisionConfig& v = fields->vision;
    MMSP_ASSERT(v.spatial_merge_size == c.conventions.spatial_merge_size);
    check_mrope(c, text);
    const char* out_key =
        variant == QwenVariant::qwen2_vl ? "vision_config.hidden_size" : "vision_config.out_hidden_size";
    MMSP_CHECK(v.out_hidden_size == c.text.hidden_size, out_key, " (", v.out_hidden_size, ") must equal the decoder's ",
               text.name("hidden_size"), " (", c.text.hidden_size, "): merged vision rows replace token embeddings");
    MMSP_CHECK(static_cast<int64_t>(v.deepstack_visual_indexes.size()) <= c.text.num_hidden_layers,
               "vision_config.deepstack_visual_indexes ", join(v.deepstack_visual_indexes), " feeds ",
               v.deepstack_visual_indexes.size(), " decoder layers, but ", text.name("num_hidden_layers"), " is ",
               c.text.num_hidden_layers);
    config_parts::check_token_ids(c, "image_token_id");
  }

  std::shared_ptr<Vlm> build(const ModelConfig& c) const override { return build_qwen_vl(c); }

  std::shared_ptr<const PixelGeometry> geometry(const ModelConfig& c) const override {
    MMSP_ASSERT(qwen_vision_of(c));
    return std::make_shared<QwenPixelGeometry>(*qwen_vision_of(c), c.conventions, qwen_variant_of(c));
  }

  hf::CheckpointNaming checkpoint_naming(const ModelConfig& c) const override {
    hf::CheckpointNaming naming;
    std::string embedding;
    if (qwen_variant_of(c) != QwenVariant::qwen3_vl) {
      // mmsp: visual.*, model.*, lm_head.* (the released files' layout). transformers
      // >= 4.52 names them model.visual.*, model.language_model.*, lm_head.* and maps
      // the released layout in through
      //   _checkpoint_conversion_mapping = {"^visual": "model.visual",
      //       r"^model(?!\.(language_model|visual))": "model.language_model"}
      // (models/qwen2_vl/modeling_qwen2_vl.py, qwen2_5_vl likewise); here the reverse.
      naming.prefix_aliases = {{"model.visual.", "visual."}, {"model.language_model.", "model."}};
      embedding = "model.embed_tokens.weight";
    } else {
      // mmsp and the released Qwen3-VL / Qwen3.5 files: model.visual.*,
      // model.language_model.*, lm_head.*. The Qwen2-VL-style legacy layout (visual.*,
      // model.*) is accepted too, as transformers' conversion mapping accepts it for
      // Qwen2-VL: the identity pairs come first so that "model.visual." is not read as
      // a legacy "model." name.
      naming.prefix_aliases = {{"model.visual.", "model.visual."},
                               {"model.language_model.", "model.language_model."},
                               {"visual.", "model.visual."},
                               {"model.", "model.language_model."}};
      embedding = "model.language_model.embed_tokens.weight";
      // Qwen3.5's multi-token-prediction head: transformers drops it on load
      // (_keys_to_ignore_on_load_unexpected = [r"^mtp.*"], models/qwen3_5).
      if (hybrid(c.model_type)) naming.ignored_prefixes = {"mtp."};
      // Qwen3-VL-MoE's fused experts: the released [E, hidden, 2I] / [E, I, hidden], or the
      // [E, 2I, hidden] / [E, hidden, I] transformers >= 5 writes (it reads both, by shape).
      if (c.text.moe.layout == ExpertLayout::fused)
        naming.transposable_suffixes = {".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"};
    }
    if (c.tie_word_embeddings) {
      naming.tied_input = embedding;
      naming.tied_output = "lm_head.weight";
    }
    return naming;
  }
};

}  // namespace

const Family& qwen_vl_family() {
  static const QwenVLFamily family;
  return family;
}

}  // namespace mmsp::model
