// The names a family's released checkpoints use for mmsp's parameters: the legacy and
// the current transformers layouts (transformers reads both through its
// _checkpoint_conversion_mapping), tensors transformers drops on load, tied embeddings.
#pragma once

#include "mmsp/model/config/config.h"
#include "mmsp/hf/hf_directory.h"

namespace mmsp::model {

// For the model built from `config` (names as its named_parameters() gives them).
hf::CheckpointNaming checkpoint_naming(const ModelConfig& config);

// The layout LLaVA-style models share (LLaVA, InternVL): mmsp's and the released *-hf
// files' vision_tower.*, multi_modal_projector.*, language_model.model.*,
// language_model.lm_head.*; and transformers >= 4.52's model.vision_tower.*,
// model.multi_modal_projector.*, model.language_model.*, lm_head.*, which it maps from
// the old names by _checkpoint_conversion_mapping (models/llava/modeling_llava.py,
// models/internvl/modeling_internvl.py); here the reverse.
hf::CheckpointNaming llava_layout_naming(bool tie_word_embeddings);

}  // namespace mmsp::model
