// A Hugging Face config.json parsed once into typed, validated structs: the decoder, the
// planner's conventions (token ids, mRoPE sections) and the family's own part (its vision
// encoder and projector, declared in the family's folder). The model_type picks the family
// (family.h's registry); an unknown one is an error listing the supported.
// Building modules and loading weights from it is the model's business, not this file's.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/model/config/text_config.h"
#include "mmsp/plan/model_conventions.h"

namespace mmsp::model {

// What a family reads besides the decoder and the conventions (its vision tower, the
// projector joining it to the decoder). Each family declares its own in its folder with
// the accessors that read it (qwen_vision_of(c), clip_vision_of(c), ...); shared code
// never looks inside.
struct FamilyFields {
  virtual ~FamilyFields() = default;
};

struct ModelConfig {
  // model_type of the file ("qwen2_vl", "qwen3_5", "llava", ...)
  std::string model_type;
  // token ids, spatial merge, mRoPE sections and interleaving, as the planner reads them;
  // conventions.name is the planner's family (qwen3_5 plans as "qwen3_vl")
  plan::ModelConventions conventions;
  // the language decoder
  TextConfig text;
  // the family's own part: vision tower and projector (set by the family's read_config)
  std::shared_ptr<const FamilyFields> family_fields;
  // LM head shares the token embedding's weight (top level or text_config; either true ties)
  bool tie_word_embeddings = false;
};

// Parses and validates; every error names the field (e.g. "text_config.num_key_value_heads")
// and its value. `source` (a path) prefixes error messages.
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& source = "config.json");

// Reads and parses a config.json file; errors name the path.
ModelConfig load_model_config(const std::string& path);

// The decoder's attention of a config.json as the planner prices its bytes (`mmsp plan`,
// mmsp.plan): the model's own when the config parses as one (bf16 elements, as released
// models train), else Qwen2-VL-7B's default shape with `why` saying why (the planner
// reads configs the model refuses, e.g. an mrope_section against head_dim).
plan::AttentionShape planned_attention_shape(const nlohmann::json& config, const std::string& source, std::string& why);

// The config's family part as the family's own type; null for a config of another family.
template <class Fields>
const Fields* family_fields_as(const ModelConfig& c) {
  return dynamic_cast<const Fields*>(c.family_fields.get());
}

// One member of the family part (family_field(c, &QwenFields::vision)); null for another family.
template <class Fields, class T>
const T* family_field(const ModelConfig& c, T Fields::*member) {
  const Fields* f = family_fields_as<Fields>(c);
  return f ? &(f->*member) : nullptr;
}

}  // namespace mmsp::model
