// The module names transformers 5 gives mmsp's parameters in memory (model.language_model.*,
// model.visual.* or model.vision_tower.*, model.multi_modal_projector.*, lm_head.*): the
// names peft's adapter files carry after "base_model.model." (peft's LoraModel wraps the
// transformers model and saves its state_dict keys, less the adapter's name). mmsp's own
// names are the released files' (checkpoint_naming.h), which differ for Qwen2-VL, Qwen2.5-VL,
// LLaVA and InternVL.
#pragma once

#include <string>
#include <vector>

#include "mmsp/hf/hf_directory.h"

#include "mmsp/model/config/config.h"

namespace mmsp::model {

// "model.layers.0.self_attn.q_proj.lora_A.weight" of a qwen2_vl model ->
// "model.language_model.layers.0.self_attn.q_proj.lora_A.weight".
std::string transformers_name(const ModelConfig& config, const std::string& mmsp_name);

// Reading a peft adapter file (`--model ADAPTER_DIR`): its keys "base_model.model." + the
// transformers name, read as mmsp's names (the inverse of transformers_name).
hf::CheckpointNaming peft_adapter_naming(const ModelConfig& config);

// The --lora-targets that adapt the modules of these transformers names: each module's last
// name, "vision." + it for the vision tower's and the projector's (as add_lora names them).
std::vector<std::string> lora_targets_of(const std::vector<std::string>& transformers_modules);

}  // namespace mmsp::model
