// The Qwen-VL variants by name; see qwen_variant.h.
#include "mmsp/model/families/qwen_vl/qwen_variant.h"

#include "mmsp/core/check.h"
#include "mmsp/model/config/config.h"

namespace mmsp::model {

std::string to_string(QwenVariant variant) {
  switch (variant) {
    case QwenVariant::qwen2_vl:
      return "qwen2_vl";
    case QwenVariant::qwen2_5_vl:
      return "qwen2_5_vl";
    case QwenVariant::qwen3_vl:
      return "qwen3_vl";
  }
  return "unknown";
}

QwenVariant qwen_variant_of(const std::string& model_type) {
  if (model_type == "qwen2_vl") return QwenVariant::qwen2_vl;
  if (model_type == "qwen2_5_vl") return QwenVariant::qwen2_5_vl;
  MMSP_CHECK(model_type == "qwen3_vl" || model_type == "qwen3_5" || model_type == "qwen3_vl_moe" ||
                 model_type == "qwen3_5_moe",
             "model_type \"", model_type,
             "\" is not a Qwen-VL model (qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_vl_moe, qwen3_5_moe)");
  return QwenVariant::qwen3_vl;
}

QwenVariant qwen_variant_of(const ModelConfig& config) { return qwen_variant_of(config.model_type); }

}  // namespace mmsp::model
