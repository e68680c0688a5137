// The model families by name, for the family folders that still tell variants apart (the
// Qwen vision and text variants, families/qwen_vl/). Shared code reads what a family
// declares instead (its TextDialect, conventions, geometry: family.h), never this enum; the
// planner never sees it; the family registry maps a config's model_type to its family.
#pragma once

#include <string>

namespace mmsp::model {

enum class ModelFamily { qwen2_vl, qwen2_5_vl, qwen3_vl, llava, internvl };

// "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "internvl"
std::string to_string(ModelFamily family);

}  // namespace mmsp::model
