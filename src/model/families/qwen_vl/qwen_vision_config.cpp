// The Qwen-VL vision_config; see qwen_vision_config.h.
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"

#include <cmath>

#include "config_parts.h"
#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/model/families/qwen_vl/qwen_variant.h"

namespace mmsp::model {

using config_parts::check_activation;
using json_fields::join;
using json_fields::JsonFields;

namespace {

// Block indices: each in [0, depth), strictly increasing (the order the blocks run in).
void check_block_list(const JsonFields& f, const std::string& key, const std::vector<int64_t>& blocks, int64_t depth) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    MMSP_CHECK(blocks[i] < depth, f.name(key), " ", join(blocks), " names block ", blocks[i],
               ", but vision_config.depth is ", depth, " (blocks 0..", depth - 1, ")");
    MMSP_CHECK(i == 0 || blocks[i] > blocks[i - 1], f.name(key), " ", join(blocks), " must be strictly increasing");
  }
}

}  // namespace

QwenVisionConfig default_qwen_vision_config(QwenVariant variant) {
  QwenVisionConfig v;  // Qwen2VLVisionConfig
  switch (variant) {
    case QwenVariant::qwen2_vl:
      break;
    case QwenVariant::qwen2_5_vl:  // Qwen2_5_VLVisionConfig (its hidden_size default is 3584)
      v.hidden_size = 3584;
      v.intermediate_size = 3420;
      v.hidden_act = "silu";
      v.window_size = 112;
      v.fullatt_block_indexes = {7, 15, 23, 31};
      break;
    case QwenVariant::qwen3_vl:  // Qwen3VLVisionConfig
      v.depth = 27;
      v.hidden_size = 1152;
      v.intermediate_size = 4304;
      v.hidden_act = "gelu_pytorch_tanh";
      v.patch_size = 16;
      v.num_position_embeddings = 2304;
      v.deepstack_visual_indexes = {8, 16, 24};
      break;
  }
  return v;
}

QwenVisionConfig parse_qwen_vision_config(const nlohmann::json& vision, QwenVariant variant) {
  QwenVisionConfig v = default_qwen_vision_config(variant);
  const JsonFields f(vision, "vision_config.");
  v.depth = f.integer("depth", v.depth);
  std::string width_key = "hidden_size";
  if (variant == QwenVariant::qwen2_vl) {
    // Qwen2-VL: embed_dim is the width, hidden_size the merger's output, MLP = width * ratio.
    width_key = "embed_dim";
    v.hidden_size = f.integer("embed_dim", v.hidden_size);
    v.out_hidden_size = f.integer("hidden_size", v.out_hidden_size);
    const double ratio = f.number("mlp_ratio", 4.0);
    const double mlp = static_cast<double>(v.hidden_size) * ratio;
    MMSP_CHECK(mlp >= 1 && mlp < 9.0e18, f.name("mlp_ratio"), " (", ratio, ") times ", f.name("embed_dim"), " (",
               v.hidden_size, ") must give an MLP width >= 1");
    v.intermediate_size = static_cast<int64_t>(mlp);  // Python's int(): truncates
  } else {
    v.hidden_size = f.integer("hidden_size", v.hidden_size);
    v.intermediate_size = f.integer("intermediate_size", v.intermediate_size);
    v.out_hidden_size = f.integer("out_hidden_size", v.out_hidden_size);
  }
  v.num_heads = f.integer("num_heads", v.num_heads);
  config_parts::check_size_limits(f, {{"depth", v.depth, config_parts::kMaxLayers},
                                      {width_key.c_str(), v.hidden_size, config_parts::kMaxWidth},
                                      {"intermediate_size", v.intermediate_size, config_parts::kMaxWidth},
                                      {"out_hidden_size", v.out_hidden_size, config_parts::kMaxWidth},
                                      {"num_heads", v.num_heads, config_parts::kMaxWidth}});
  v.hidden_act = f.string("hidden_act", v.hidden_act);
  check_activation(f, "hidden_act", v.hidden_act);
  // transformers renamed in_chans (still in Qwen2/2.5-VL files) to in_channels.
  const int64_t chans = f.integer("in_chans", v.in_channels);
  v.in_channels = f.integer("in_channels", chans);
  MMSP_CHECK(v.in_channels == chans, f.name("in_channels"), " (", v.in_channels, ") and ", f.name("in_chans"), " (",
             chans, ") disagree");
  v.patch_size = f.integer("patch_size", v.patch_size);
  v.temporal_patch_size = f.integer("temporal_patch_size", v.temporal_patch_size);
  v.spatial_merge_size = f.integer("spatial_merge_size", v.spatial_merge_size);
  v.initializer_range = f.number("initializer_range", v.initializer_range, true);
  // Released models use 1-2 frames, 14-16 pixels and a merge of 2: these bounds keep
  // the patch embedding (channels × frames × patch²) from asking for gigabytes.
  const struct {
    const char* key;
    int64_t value, max;
  } limits[] = {{"temporal_patch_size", v.temporal_patch_size, 64},
                {"patch_size", v.patch_size, 1024},
                {"spatial_merge_size", v.spatial_merge_size, 64},
                {"in_channels", v.in_channels, 64}};
  for (const auto& l : limits)
    MMSP_CHECK(l.value <= l.max, f.name(l.key), " ", l.value, " is beyond what a vision tower uses: at most ", l.max);
  const int64_t patch_row = v.patch_row();  // the factors are bounded above: no overflow
  MMSP_CHECK(patch_row <= (int64_t{1} << 22), f.name("in_channels"), " × ", f.name("temporal_patch_size"), " × ",
             f.name("patch_size"), "² = ", patch_row, " values per patch is beyond 4194304");

  MMSP_CHECK(v.hidden_size % v.num_heads == 0, f.name("num_heads"), " (", v.num_heads, ") must divide ",
             f.name(width_key), " (", v.hidden_size, ")");
  // 2-D rotary: half of each head's rotary frequencies index rows, half columns.
  MMSP_CHECK(v.head_dim() % 4 == 0, "vision head size ", f.name(width_key), " / ", f.name("num_heads"), " = ",
             v.hidden_size, " / ", v.num_heads, " = ", v.head_dim(),
             " must be a multiple of 4 for the 2-D rotary embedding");

  if (variant == QwenVariant::qwen2_5_vl) {
    v.window_size = f.integer("window_size", v.window_size);
    const int64_t unit = v.patch_size * v.spatial_merge_size;
    MMSP_CHECK(v.window_size % unit == 0, f.name("window_size"), " (", v.window_size,
               ") must be a multiple of patch_size * spatial_merge_size (", v.patch_size, " * ", v.spatial_merge_size,
               " = ", unit, ")");
    v.fullatt_block_indexes = f.integers("fullatt_block_indexes", v.fullatt_block_indexes);
    check_block_list(f, "fullatt_block_indexes", v.fullatt_block_indexes, v.depth);
  }
  if (variant == QwenVariant::qwen3_vl) {
    v.num_position_embeddings = f.integer("num_position_embeddings", v.num_position_embeddings);
    const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
    MMSP_CHECK(side * side == v.num_position_embeddings, f.name("num_position_embeddings"), " (",
               v.num_position_embeddings, ") must be a square: the table is a grid interpolated ", "to each image");
    v.deepstack_visual_indexes = f.integers("deepstack_visual_indexes", v.deepstack_visual_indexes);
    check_block_list(f, "deepstack_visual_indexes", v.deepstack_visual_indexes, v.depth);
  }
  return v;
}

}  // namespace mmsp::model
