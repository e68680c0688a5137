// The names a family's released checkpoints use for mmsp's parameters: the legacy and
// the current transformers layouts (transformers reads both through its
// _checkpoint_conversion_mapping), tensors transformers drops on load, tied embeddings.
#pragma once

#include "mmsp/model/config.h"
#include "mmsp/model/hf_directory.h"

namespace mmsp::model {

// For the model built from `config` (names as its named_parameters() gives them).
CheckpointNaming checkpoint_naming(const ModelConfig& config);

}  // namespace mmsp::model
