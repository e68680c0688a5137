// Family names; see model_family.h.
#include "mmsp/model/model_family.h"

namespace mmsp::model {

std::string to_string(ModelFamily family) {
  switch (family) {
    case ModelFamily::qwen2_vl: return "qwen2_vl";
    case ModelFamily::qwen2_5_vl: return "qwen2_5_vl";
    case ModelFamily::qwen3_vl: return "qwen3_vl";
    case ModelFamily::llava: return "llava";
    case ModelFamily::internvl: return "internvl";
  }
  return "unknown";
}

}  // namespace mmsp::model
