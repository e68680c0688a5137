// A Hugging Face config.json parsed once into typed, validated structs: the decoder, the
// vision encoder of the family, and the planner's conventions (token ids, mRoPE sections).
// Supported model_type: qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5 (a hybrid decoder of
// full-attention and Gated DeltaNet layers behind Qwen3-VL's vision tower, with family
// qwen3_vl's conventions), llava, internvl (InternViT + a qwen2 / qwen3 decoder); anything
// else is an error.
// Building modules and loading weights from it is the model's business, not this file's.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

// Each family's vision fields are declared in its folder; ModelConfig holds them side by side.
#include "mmsp/model/families/internvl/internvl_config.h"
#include "mmsp/model/families/llava/clip_config.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/model_family.h"
#include "mmsp/model/text_config.h"
#include "mmsp/plan/model_conventions.h"

namespace mmsp::model {

struct ModelConfig {
  // model_type of the file: "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "llava" or "internvl"
  std::string model_type;
  // the planner's family (qwen3_5 plans as qwen3_vl: the same positions and placeholders)
  ModelFamily family = ModelFamily::qwen2_vl;
  // token ids, spatial merge, mRoPE sections and interleaving, as the planner reads them
  plan::ModelConventions conventions;
  // the language decoder
  TextConfig text;
  // the Qwen-VL family's vision encoder (set for qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5)
  std::optional<QwenVisionConfig> qwen_vision;
  // LLaVA's CLIP encoder and projector (both set for llava)
  std::optional<ClipVisionConfig> clip_vision;
  std::optional<LlavaProjectorConfig> llava;
  // InternVL's InternViT tower and the fields joining it to the decoder (both set for internvl)
  std::optional<InternVisionConfig> intern_vision;
  std::optional<InternVLProjectorConfig> internvl;
  // LM head shares the token embedding's weight (top level or text_config; either true ties)
  bool tie_word_embeddings = false;
};

// Parses and validates; every error names the field (e.g. "text_config.num_key_value_heads")
// and its value. `source` (a path) prefixes error messages.
ModelConfig parse_model_config(const nlohmann::json& config,
                               const std::string& source = "config.json");

// Reads and parses a config.json file; errors name the path.
ModelConfig load_model_config(const std::string& path);

}  // namespace mmsp::model
