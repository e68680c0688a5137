// The LLaVA family (model_type llava, llava-1.5 style): a CLIP tower on one fixed-size
// image, the two-layer projector, a Llama decoder; one placeholder per patch ("default"
// drops the class token) or per patch plus the class token ("full"); 1-D RoPE.
#pragma once

#include "mmsp/model/family.h"

namespace mmsp::model {

const Family& llava_family();

}  // namespace mmsp::model
