// The Qwen-VL family's variants: what the vision tower, the text dialect and the
// processor geometry tell apart. Qwen3.5 and the mixture-of-experts models (qwen3_vl_moe,
// qwen3_5_moe) are the qwen3_vl variant (their tower is Qwen3-VL's; their decoders are
// told apart by model_type). Only this folder sees the variants.
#pragma once

#include <string>

namespace mmsp::model {

struct ModelConfig;

enum class QwenVariant { qwen2_vl, qwen2_5_vl, qwen3_vl };

// "qwen2_vl", "qwen2_5_vl", "qwen3_vl": also the planner's family name (ModelConventions::name)
std::string to_string(QwenVariant variant);

// The variant of a Qwen-VL config.json's model_type ("qwen3_5", "qwen3_vl_moe" and
// "qwen3_5_moe" are qwen3_vl); an error for
// another model_type.
QwenVariant qwen_variant_of(const std::string& model_type);
QwenVariant qwen_variant_of(const ModelConfig& config);

}  // namespace mmsp::model
