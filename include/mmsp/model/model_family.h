// The model families by name, for the readers that still differ by family: transformers'
// text defaults (text_config.h, shared) and the Qwen vision variants
// (families/qwen_vl/qwen_vision_config.h). The planner never sees it (it reads
// plan::ModelConventions' fields); the family registry (family.h) maps a config's
// model_type to its family.
#pragma once

#include <string>

namespace mmsp::model {

enum class ModelFamily { qwen2_vl, qwen2_5_vl, qwen3_vl, llava, internvl };

// "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "internvl"
std::string to_string(ModelFamily family);

}  // namespace mmsp::model
