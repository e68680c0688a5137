// The Qwen-VL family's variants: what the vision tower, the text dialect and the
// processor geometry tell apart. Qwen3.5 is the qwen3_vl variant (its tower is Qwen3-VL's;
// its decoder is told apart by model_type). Only this folder sees the variants.
#pragma once

#include <string>

namespace mmsp::model {

struct ModelConfig;

enum class QwenVariant { qwen2_vl, qwen2_5_vl, qwen3_vl };

// "qwen2_vl", "qwen2_5_vl", "qwen3_vl": also the planner's family name (ModelConventions::name)
std::string to_string(QwenVariant variant);

// The variant of a Qwen-VL config.json's model_type ("qwen3_5" is qwen3_vl); an error for
// another model_type.
QwenVariant qwen_variant_of(const std::string& model_type);
QwenVariant qwen_variant_of(const ModelConfig& config);

}  // namespace mmsp::model
