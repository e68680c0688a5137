// Checks of a training run that need no model and no peer: the numeric limits of the
// flags and the --out directory. Each
// throws mmsp::Error naming the flag, the value and the rule; every rank runs them
// before the first collective (docs/train.md, "What is checked before a step").
#pragma once

#include <cstdint>
#include <string>

#include "mmsp/dist/mesh_shape.h"
#include "mmsp/train/trainer.h"

namespace mmsp::train {

// Upper bounds of the numeric flags: nothing is allocated from a flag beyond them.
constexpr int64_t kMaxSteps = 1'000'000'000;          // --steps --stop-after --warmup --checkpoint-every
constexpr int64_t kMaxTokensPerRank = 1 << 20;         // --tokens-per-rank (1 Mi tokens per rank)
constexpr int64_t kMaxShapesSamples = 10'000'000;      // --shapes-samples (an epoch order of 80 MB)
constexpr int64_t kMaxAttentionBlock = 1 << 16;        // --attention-block
constexpr int64_t kMaxImagePixelsBound = int64_t{1} << 31;  // --max-image-pixels (stb's own limit)

// Ranges and finiteness of the numeric flags (the lower bounds are check_train_options's).
void check_train_limits(const TrainOptions& options);

// --out DIR: creates it and writes and removes a probe file, so that a file in the
// way, a read-only file system or missing permissions fail now, on this rank.
void probe_out_dir(const std::string& dir);

}  // namespace mmsp::train
