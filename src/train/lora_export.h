// What a LoRA run's checkpoint holds besides the training state (--lora-rank): hf/ the merged
// model (each adapted weight + scale · B A, by the base's names: the directory transformers,
// vLLM and `mmsp train --model` read, as peft's merge_and_unload would write it) and adapter/,
// peft's adapter directory (PeftModel.from_pretrained(base, dir)). Private to train/.
#pragma once

#include "mmsp/dist/mesh.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/lora.h"
#include "mmsp/model/named_params.h"
#include "mmsp/train/checkpoint/checkpoint.h"
#include "mmsp/train/train_options.h"
#include "mmsp/train/weight_update.h"

namespace mmsp::train {

// The weights with every adapter merged into its map's weight, adapters left out.
model::NamedParams merged_weights(const model::NamedParams& weights, const model::LoraOptions& lora);

// Every rank calls (under --shard parameters the weights are gathered: a collective); on
// rank 0 `ckpt` gets the merged hf/ and the adapter/ writer. `base`: where the base came from.
void add_lora_outputs(CheckpointOptions& ckpt, const TrainOptions& o, const model::ModelConfig& config,
                      const std::string& base, WeightUpdate& update, const dist::Mesh& mesh);

}  // namespace mmsp::train
