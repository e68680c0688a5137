// Model conventions the planner needs from a Hugging Face config.json: which token ids
// mark vision placeholders, the spatial merge size, and how positions are computed.
// Parsing only; no weights, no tensors. Missing fields take the family's released value.
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

enum class ModelFamily { qwen2_vl, qwen2_5_vl, qwen3_vl, llava, internvl };

struct ModelConventions {
  ModelFamily family = ModelFamily::qwen2_vl;
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

  // 3-D mRoPE positions (Qwen family) instead of 1-D positions (LLaVA, InternVL).
  bool uses_mrope() const;
  // Qwen3-VL writes each temporal patch of a video as its own vision block.
  bool video_frames_as_blocks() const;
  bool supports_video() const { return video_token_id >= 0; }
  // Qwen2.5-VL scales a video's t positions by second_per_grid_ts · tokens_per_second.
  bool scales_video_time() const { return family == ModelFamily::qwen2_5_vl; }
  bool has_block_markers() const { return vision_start_token_id >= 0; }
};

// The planner's name of a convention family ("qwen2_vl", ...). Which Hugging Face
// model_type has which conventions is the model layer's registry (model/family.h).
std::string to_string(ModelFamily family);

// The released models' values (Qwen2-VL-7B, Qwen2.5-VL-7B, Qwen3-VL, llava-1.5-hf, InternVL3-hf).
ModelConventions default_conventions(ModelFamily family);

// Reads the fields above from a parsed config.json of the conventions of
// `defaults.family`, keeping `defaults` where the file is silent (a model family passes
// its released values); model_type is not read. Errors name the field.
// rope_parameters (newer transformers) counts as rope_scaling.
ModelConventions conventions_from_config(const nlohmann::json& config, const ModelConventions& defaults);

}  // namespace mmsp::plan
