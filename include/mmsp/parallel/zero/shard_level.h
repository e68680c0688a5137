// `--shard`: what of the training state is split over every rank of the world, each
// level adding to the one before (the ZeRO stages): see sharded_model.h. `parameters`
// shards and gathers the weights of every hooked unit, not only the decoder layers: the
// layers, the LM head, the untied token embedding and the vision blocks (Vlm::hook_units).
#pragma once

#include <string>

namespace mmsp::parallel {

enum class ShardLevel {
  none,        // every rank holds everything
  optimizer,   // ZeRO-1: fp32 master weights and AdamW moments
  gradients,   // ZeRO-2: and the gradients, reduce-scattered layer by layer in the backward
  parameters,  // ZeRO-3: and the weights of every hooked unit (decoder layers, LM head, embedding,
               // vision blocks), gathered just before each use
};

ShardLevel parse_shard_level(const std::string& name);  // "none" | "optimizer" | "gradients" | "parameters"
const char* to_string(ShardLevel level);

}  // namespace mmsp::parallel
