// The Qwen-VL family: model_type qwen2_vl, qwen2_5_vl, qwen3_vl and qwen3_5 (a hybrid
// decoder behind Qwen3-VL's vision tower). Patch rows in the Qwen2-VL processor's
// order, spatial_merge_size² patches per placeholder, 3-D mRoPE positions.
#pragma once

#include "mmsp/model/family.h"

namespace mmsp::model {

const Family& qwen_vl_family();

}  // namespace mmsp::model
