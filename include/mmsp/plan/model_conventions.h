// Model conventions the planner needs from a Hugging Face config.json: which token ids
// mark vision placeholders, the spatial merge size, and how positions are computed.
// Parsing only; no weights, no tensors. The values come from the model families.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace mmsp::plan {

// Bounds of the values that scale video positions (t = frame × second_per_grid_t ×
// tokens_per_second): with any frame count below 2^31 the product stays far inside
// int64, and real videos use seconds and rates of a few units.
constexpr double kMaxSecondsPerGrid = 1e4;
constexpr double kMaxTokensPerSecond = 1e4;

// How a model gives its tokens positions: 3-D mRoPE (the Qwen family: t, h, w) or 1-D RoPE.
enum class PositionKind { mrope, rope_1d };

// What the planner knows of a model. The planner never asks which family a model is: each
// family (model/families/*, through the model layer's registry) fills these fields from
// its released values and its config.json.
struct ModelConventions {
  // The conventions' name in messages and plan JSON ("qwen2_vl", "qwen2_5_vl", "qwen3_vl",
  // "llava", "internvl"; Qwen3.5 plans as "qwen3_vl").
  std::string name = "qwen2_vl";
  // Capabilities.
  PositionKind positions = PositionKind::mrope;
  // Qwen3-VL writes each temporal patch of a video as its own vision block (t = 1 each).
  bool frames_as_blocks = false;
  // Qwen2.5-VL scales a video's t positions by second_per_grid_ts · tokens_per_second,
  // and only it reads second_per_grid_ts.
  bool video_time_scaled = false;

  // token repeated once per embedding row of an image (<|image_pad|>, <image>, <IMG_CONTEXT>)
  int64_t image_token_id = 151655;
  // token repeated once per embedding row of a video (<|video_pad|>); -1 where videos are unsupported
  int64_t video_token_id = 151656;
  // token that opens a vision block (<|vision_start|>, <img>); -1 where blocks are bare runs (LLaVA)
  int64_t vision_start_token_id = 151652;
  // token that closes a vision block (<|vision_end|>, </img>); -1 where blocks are bare runs
  int64_t vision_end_token_id = 151653;
  // rows an image takes beyond its merged patches: 1 where LLaVA keeps the vision
  // tower's class token (vision_feature_select_strategy "full"), else 0
  int64_t class_rows = 0;
  // patches merged into one embedding row per side (vision_config.spatial_merge_size; InternVL 1/downsample_ratio)
  int64_t spatial_merge_size = 2;
  // Qwen2.5-VL temporal scaling: t position = frame * second_per_grid_t * tokens_per_second
  double tokens_per_second = 4.0;  // in [0, kMaxTokensPerSecond]
  // rows of the rotary frequencies given to t, h, w (rope_scaling.mrope_section)
  std::array<int64_t, 3> mrope_section{16, 24, 24};
  // Qwen3-VL interleaves t/h/w frequencies instead of splitting them in chunks
  bool mrope_interleaved = false;
  // Vision-tower SP (vision_split.h): how the tower can encode one item over several ranks.
  // vision_heads > 0: in whole merge windows, the blocks' attention exchanged between the
  // ranks (Qwen: the heads must divide by them). vision_split_by_frames: in whole frames
  // (InternVL's tiles), which the tower encodes independently: nothing exchanged. Neither:
  // items are encoded whole.
  int64_t vision_heads = 0;
  bool vision_split_by_frames = false;

  bool uses_mrope() const { return positions == PositionKind::mrope; }
  bool video_frames_as_blocks() const { return frames_as_blocks; }
  bool scales_video_time() const { return video_time_scaled; }
  bool supports_video() const { return video_token_id >= 0; }
  bool has_block_markers() const { return vision_start_token_id >= 0; }
};

// Readers the families' conventions parsers share (model/families/*/): errors name the
// field as config.json spells it.
namespace conventions_fields {

// Throws unless `config` is a JSON object.
void check_object(const nlohmann::json& config);
// config[key] as a token id >= 0; `fallback` where absent or null.
int64_t token_id(const nlohmann::json& config, const char* key, int64_t fallback);
// config[key] when it is an object, else null.
const nlohmann::json* object(const nlohmann::json& config, const char* key);
// rope_scaling's mrope_section and mrope_interleaved, at the top (Qwen2/2.5-VL) and then in
// text_config (Qwen3-VL, newer files); rope_parameters (newer transformers) counts as rope_scaling.
void read_mrope(const nlohmann::json& config, ModelConventions& c);
// Image, video, vision start and vision end token ids must differ.
void check_distinct_token_ids(const ModelConventions& c);

}  // namespace conventions_fields

}  // namespace mmsp::plan
