// The InternVL family (model_type internvl, the Hugging Face format of InternVL3 / 3.5):
// InternViT on 448-pixel tiles of each image's dynamic tiling, pixel shuffle, the mlp1
// projector, a Qwen2 / Qwen3 decoder; image_seq_length placeholders per tile; 1-D RoPE.
#pragma once

#include "mmsp/model/family.h"

namespace mmsp::model {

const Family& internvl_family();

}  // namespace mmsp::model
