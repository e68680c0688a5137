// `--shard`: what of the training state is split over every rank of the world, each
// level adding to the one before (the ZeRO stages): see sharded_adamw.h.
#pragma once

#include <string>

namespace mmsp::train {

enum class ShardLevel {
  none,        // every rank holds everything
  optimizer,   // ZeRO-1: fp32 master weights and AdamW moments
  gradients,   // ZeRO-2: and the gradients, reduce-scattered layer by layer in the backward
  parameters,  // ZeRO-3: and the decoder layers' weights, gathered just before each use
};

ShardLevel parse_shard_level(const std::string& name);  // "none" | "optimizer" | "gradients" | "parameters"
const char* to_string(ShardLevel level);

}  // namespace mmsp::train
