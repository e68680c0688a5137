// `mmsp train --model ADAPTER_DIR`: continue a peft LoRA adapter (one peft's save_pretrained
// or an mmsp checkpoint's adapter/ wrote). The run's LoRA becomes the adapter's (rank r,
// alpha lora_alpha, the targets its modules' names give) and its model the adapter's base:
// base_model_name_or_path, or --base-model DIR where that is a hub id or was moved. The
// adapters then start from the file's lora_A and lora_B (train/trainable.cpp), so step 1's
// loss is the peft model's. A flag that contradicts the adapter is refused, naming both.
#pragma once

#include <string>

#include "mmsp/train/train_options.h"

namespace mmsp::train {

// Which LoRA flags the command line gave (left out: the adapter's values are taken).
struct AdapterFlags {
  bool rank = false, alpha = false, targets = false;
  std::string base_model;  // --base-model DIR; empty: base_model_name_or_path
};

// When o.inputs.model is a peft adapter directory: the run's LoRA options, base model and
// o.finetune.lora_adapter from it (no tensor is read). Otherwise nothing changes (a
// --base-model without an adapter is refused).
void start_from_peft_adapter(TrainOptions& o, const AdapterFlags& given);

}  // namespace mmsp::train
