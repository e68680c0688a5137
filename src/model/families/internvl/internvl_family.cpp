// The InternVL family's registry entry; see internvl_family.h. Reads the nested
// text_config (qwen2 or qwen3), the InternViT vision_config and the fields joining them,
// builds the InternVL model (internvl_model.h), and gives the processor's geometry (dynamic tiling of each image
// at its own size, ImageNet normalisation) and the checkpoints' names.
#include "mmsp/model/families/internvl/internvl_family.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "config_parts.h"
#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/model/checkpoint_naming.h"
#include "mmsp/model/families/internvl/dynamic_tiling.h"
#include "mmsp/model/families/internvl/internvl_config.h"
#include "mmsp/model/families/internvl/internvl_model.h"

namespace mmsp::model {

namespace {

using json_fields::JsonFields;

// InternVL's image processor (GotOcr2's crop_to_patches): an image becomes
// tile_count(height, width) tiles of image_size, each image_size / patch_size patches a
// side; its grid is [tiles, side, side]. Unlike Qwen-VL and LLaVA the tile count depends
// on the file's own aspect ratio, so frames are decoded at their own size and tiled here.
class InternVLPixelGeometry : public PixelGeometry {
 public:
  InternVLPixelGeometry(const InternVisionConfig& v, const InternVLProjectorConfig& p) : v_(v), p_(p) {
    tiling_.tile_size = v.image_size;
    norm_.mean = {0.485, 0.456, 0.406};  // InternVL3-hf's preprocessor_config.json: ImageNet's
    norm_.std = {0.229, 0.224, 0.225};
  }
  int64_t channels() const override { return v_.num_channels; }
  bool takes_videos() const override { return false; }
  const PixelNorm& norm() const override { return norm_; }
  int64_t fixed_side() const override { return 0; }
  // Half tiles: the shapes dataset's sides then give grids of 1×1 up to several tiles a side.
  int64_t side_unit() const override { return v_.image_size / 2; }

  plan::Grid grid_for(int64_t frames, int64_t width, int64_t height, const std::string& what) const override {
    MMSP_CHECK(frames == 1, what, " has ", frames, " frames; InternVL takes single images");
    return {tile_count(height, width, tiling_), v_.patches_per_side(), v_.patches_per_side()};
  }
  std::string grid_mismatch(const plan::Grid& g, int64_t frames, int64_t width, int64_t height,
                            const std::string& what) const override {
    if (frames != 1) return detail::concat("but ", what, " has ", frames, " frames; InternVL takes single images");
    const plan::Grid want = grid_for(1, width, height, what);
    if (g == want) return "";
    return detail::concat("but internvl cuts ", what, " (", width, " x ", height, " pixels) into ", want[0],
                          " tiles of ", v_.image_size, " px: grid [", want[0], ", ", want[1], ", ", want[2], "]");
  }
  // The file's own size: the tiling resizes it to its grid of tiles (item_pixels).
  std::pair<int64_t, int64_t> frame_size(const plan::Grid&, int64_t width, int64_t height) const override {
    return {width, height};
  }
  int64_t placeholder_rows(const plan::Grid& g) const override { return g[0] * p_.image_seq_length; }
  std::vector<int64_t> item_shape(const plan::Grid& g) const override {
    return {g[0], v_.num_channels, v_.image_size, v_.image_size};
  }
  int64_t batch_rows(const plan::Grid& g) const override { return g[0]; }
  std::vector<int64_t> row_shape() const override { return {v_.num_channels, v_.image_size, v_.image_size}; }
  std::string item_layout() const override { return "tiles x channels x image_size x image_size"; }
  at::Tensor item_pixels(const at::Tensor& frames) const override {
    MMSP_CHECK(frames.dim() == 4 && frames.size(0) == 1, "InternVL takes one frame per image, got frames ",
               frames.sizes());
    return normalize_pixels(tile_image(frames[0], tiling_), 1, norm_).contiguous();
  }

 private:
  InternVisionConfig v_;
  InternVLProjectorConfig p_;
  TilingOptions tiling_;  // the processor's defaults: 1..12 tiles, a thumbnail after several
  PixelNorm norm_;
};

// text_config.vocab_size, or transformers' default for InternVL's Qwen2 decoder.
int64_t declared_vocab_size(const nlohmann::json& config) {
  const auto text = config.find("text_config");
  if (text != config.end() && text->is_object()) {
    const auto v = text->find("vocab_size");
    if (v != text->end() && v->is_number_integer()) return v->get<int64_t>();
  }
  return 151936;
}

// InternVL's decoder fields: transformers' Qwen2Config (InternVLConfig's default
// text_config), or Qwen3Config for InternVL3.5 (no q/k/v bias, RMSNorm on each query and
// key head, head_dim 128 whatever the width).
TextDialect internvl_text_dialect() {
  TextVariant qwen2;
  TextConfig& t = qwen2.defaults;
  t.model_type = "qwen2";
  t.vocab_size = 151936;
  t.hidden_size = 4096;
  t.intermediate_size = 22016;
  t.num_hidden_layers = 32;
  t.num_attention_heads = 32;
  t.num_key_value_heads = 32;
  t.head_dim = 128;
  t.rms_norm_eps = 1e-6;
  t.rope_theta = 10000.0;
  t.max_position_embeddings = 32768;
  qwen2.qwen2_attention = true;
  TextVariant qwen3 = qwen2;
  qwen3.defaults.model_type = "qwen3";
  qwen3.defaults.qkv_bias = false;
  qwen3.defaults.qk_norm = true;
  qwen3.qwen2_attention = false;
  qwen3.head_dim_fixed = true;
  TextDialect d;
  d.family = "internvl";
  d.variants = {qwen2, qwen3};
  // InternVL3's Qwen2 decoders say "dynamic" (NTK scaling): transformers changes the
  // frequencies only beyond max_position_embeddings, which InternVLModel refuses.
  d.rope_types = {"default", "dynamic"};
  d.rope_rule = "InternVL decoders use \"default\" or \"dynamic\"";
  d.refused_rope_keys = {"mrope_section"};
  d.refused_rope_reason = "InternVL's decoder uses 1-D RoPE";
  return d;
}

class InternVLFamily : public Family {
 public:
  const char* name() const override { return "internvl"; }
  std::vector<std::string> model_types() const override { return {"internvl"}; }

  VisionTokenWords token_words() const override { return {"<IMG_CONTEXT>", "", "<img>", "</img>"}; }

  // Per patch (intern_vit.cpp): the layer's input and first norm's output, q, k, v (and
  // their norms' outputs), the attention's output, its projection and that scaled by
  // lambda_1, the residual sum, the second norm's output, fc2's output and that scaled by
  // lambda_2 (12D), the norms' statistics and the attention's log-sum-exp (4 + H); fc1's
  // output and the activation's (2I). Outside the layers: the pixels three times (the
  // step's, the tower's gathered copy and their patches in row order), the patch
  // embedding and the position sum (2D), the pixel shuffle and the projector's norm, its
  // two hidden activations (2D + 2h).
  VisionMemoryShape vision_memory(const ModelConfig& c) const override {
    const InternVisionConfig& v = *intern_vision_of(c);
    const int64_t D = v.hidden_size, I = v.intermediate_size, h = c.text.hidden_size;
    VisionMemoryShape s;
    s.blocks = v.num_hidden_layers;
    s.width = D;
    s.kept_per_block = 12 * D + 4 + v.num_attention_heads + (v.use_qk_norm ? 2 * D : 0) + 2 * I;
    s.block_transient = 2 * I;
    s.kept_outside = 4 * D + 2 * h;
    s.pixels_per_token = 3 * v.num_channels * v.patch_size * v.patch_size;
    s.row_width = h;
    return s;
  }

  // InternVL3-hf: <img> 151665, </img> 151666, <IMG_CONTEXT> 151667, 1-D positions, no video,
  // pixel shuffle with downsample_ratio 0.5 (two patches a side per row).
  plan::ModelConventions conventions(const nlohmann::json& config) const override {
    namespace fields = plan::conventions_fields;
    fields::check_object(config);
    plan::ModelConventions c;
    c.name = "internvl";
    c.positions = plan::PositionKind::rope_1d;
    c.image_token_id = fields::token_id(config, "image_token_id", 151667);
    c.video_token_id = -1;
    c.vision_start_token_id = fields::token_id(config, "image_start_token_id", 151665);
    c.vision_end_token_id = fields::token_id(config, "image_end_token_id", 151666);
    // <img> and </img> are the tokenizer's words, not the model's: transformers'
    // InternVLConfig has no field for them and the released configs leave them out, so
    // 151665/151666 are InternVL3's tokenizer, assumed. A vocabulary too small to hold
    // them has other ids for its markers, which are then text like any other: images
    // are found by their placeholder runs, as LLaVA's (transformers does the same).
    if (!config.contains("image_start_token_id") && !config.contains("image_end_token_id") &&
        std::max(c.vision_start_token_id, c.vision_end_token_id) >= declared_vocab_size(config)) {
      c.vision_start_token_id = -1;
      c.vision_end_token_id = -1;
    }
    c.spatial_merge_size = 2;
    if (config.contains("downsample_ratio")) {
      const auto& r = config.at("downsample_ratio");
      MMSP_CHECK(r.is_number() && r.get<double>() > 0 && r.get<double>() <= 1,
                 "config.json: downsample_ratio must be in (0, 1], got ", r.dump());
      const double inv = 1.0 / r.get<double>();
      MMSP_CHECK(std::fabs(inv - std::round(inv)) < 1e-6 && inv <= 64, "config.json: downsample_ratio ",
                 r.get<double>(), " must be 1/k for an integer k in 1..64 (pixel shuffle)");
      c.spatial_merge_size = static_cast<int64_t>(std::round(inv));
    }
    // InternViT encodes each tile alone: a large image's tiles can be spread over the
    // context group with nothing exchanged (vision-tower SP by frames).
    c.vision_split_by_frames = true;
    return c;
  }

  void read_config(const nlohmann::json& config, ModelConfig& c) const override {
    const JsonFields top(config, "");
    static const nlohmann::json kEmpty = nlohmann::json::object();
    const nlohmann::json* nested = top.object("text_config");
    const nlohmann::json& text_json = nested ? *nested : kEmpty;
    const JsonFields text(text_json, "text_config.");
    c.text = parse_text_config(text_json, internvl_text_dialect(), "text_config.");
    c.conventions = config_parts::read_conventions(*this, config);
    c.tie_word_embeddings = config_parts::read_tie(top, text);
    const nlohmann::json* vision = top.object("vision_config");
    auto fields = std::make_shared<InternVLFields>();
    fields->vision = parse_intern_vision_config(vision ? *vision : kEmpty);
    fields->projector = parse_internvl_projector_config(config, fields->vision);
    c.family_fields = fields;
    // The planner read the same downsample_ratio: one merge factor for placeholders and rows.
    MMSP_ASSERT(internvl_projector_of(c)->scale() == c.conventions.spatial_merge_size);
    config_parts::check_token_ids(c, "image_token_id");
  }

  std::shared_ptr<Vlm> build(const ModelConfig& c) const override { return build_internvl(c); }

  std::shared_ptr<const PixelGeometry> geometry(const ModelConfig& c) const override {
    MMSP_ASSERT(intern_vision_of(c) && internvl_projector_of(c));
    return std::make_shared<InternVLPixelGeometry>(*intern_vision_of(c), *internvl_projector_of(c));
  }

  hf::CheckpointNaming checkpoint_naming(const ModelConfig& c) const override {
    return llava_layout_naming(c.tie_word_embeddings);  // the released InternVL3-*-hf files use LLaVA's layout
  }
};

}  // namespace

const Family& internvl_family() {
  static const InternVLFamily family;
  return family;
}

}  // namespace mmsp::model
