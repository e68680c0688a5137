// The module names transformers 5 gives mmsp's parameters in memory (model.language_model.*,
// model.visual.* or model.vision_tower.*, model.multi_modal_projector.*, lm_head.*): the
// names peft's adapter files carry after "base_model.model." (peft's LoraModel wraps the
// transformers model and saves its state_dict keys, less the adapter's name). mmsp's own
// names are the released files' (checkpoint_naming.h), which differ for Qwen2-VL, Qwen2.5-VL,
// LLaVA and InternVL.
#pragma once

#include <string>

#include "mmsp/model/config/config.h"

namespace mmsp::model {

// "model.layers.0.self_attn.q_proj.lora_A.weight" of a qwen2_vl model ->
// "model.language_model.layers.0.self_attn.q_proj.lora_A.weight".
std::string transformers_name(const ModelConfig& config, const std::string& mmsp_name);

}  // namespace mmsp::model
