// The names a family's released checkpoints use for mmsp's parameters: the legacy and
// the current transformers layouts (transformers reads both through its
// _checkpoint_conversion_mapping), tensors transformers drops on load, tied embeddings,
// and which experts a rank reads under expert parallelism.
#pragma once

#include "mmsp/hf/hf_directory.h"
#include "mmsp/model/config/config.h"

namespace mmsp::model {

// For the model built from `config` (names as its named_parameters() gives them), with
// the experts it holds under expert parallelism (add_expert_shard).
hf::CheckpointNaming checkpoint_naming(const ModelConfig& config);

// Expert parallelism (moe.expert_shards > 1): this model's rows of each fused expert
// tensor, or the other experts of the per-expert layout skipped as held elsewhere.
void add_expert_shard(hf::CheckpointNaming& naming, const MoeConfig& moe);

// Refuses a directory whose experts are not the config's num_experts (a fused tensor's
// first dimension, a per-expert index beyond it), naming the tensor and both counts.
void check_expert_count(const hf::HfDirectory& dir, const ModelConfig& config);

// The layout LLaVA-style models share (LLaVA, InternVL): mmsp's and the released *-hf
// files' vision_tower.*, multi_modal_projector.*, language_model.model.*,
// language_model.lm_head.*; and transformers >= 4.52's model.vision_tower.*,
// model.multi_modal_projector.*, model.language_model.*, lm_head.*, which it maps from
// the old names by _checkpoint_conversion_mapping (models/llava/modeling_llava.py,
// models/internvl/modeling_internvl.py); here the reverse.
hf::CheckpointNaming llava_layout_naming(bool tie_word_embeddings);

}  // namespace mmsp::model
