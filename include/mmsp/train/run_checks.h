// Checks of a training run that need no model and no peer: the numeric limits of the
// flags, the --out directory, and a resume's flags against the checkpoint's. Each
// throws mmsp::Error naming the flag, the value and the rule; every rank runs them
// before the first collective (docs/train.md, "What a step does": the checks table).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

#include "mmsp/dist/flag_agreement.h"
#include "mmsp/plan/mesh.h"
#include "mmsp/train/trainer.h"

namespace mmsp::train {

// Upper bounds of the numeric flags: nothing is allocated from a flag beyond them.
constexpr int64_t kMaxSteps = 1'000'000'000;                // --steps --stop-after --warmup --checkpoint-every
constexpr int64_t kMaxTokensPerRank = 1 << 20;              // --tokens-per-rank (1 Mi tokens per rank)
constexpr int64_t kMaxShapesSamples = 10'000'000;           // --shapes-samples (an epoch order of 80 MB)
constexpr int64_t kMaxAttentionBlock = 1 << 16;             // --attention-block
constexpr int64_t kMaxAccumulate = 1 << 16;                 // --accumulate (micro-steps per step)
constexpr double kMaxLr = 1.0;                              // --lr
constexpr int64_t kMaxImagePixelsBound = int64_t{1} << 31;  // --max-image-pixels (stb's own limit)

// Ranges and finiteness of the numeric flags (the lower bounds are check_train_options's).
void check_train_limits(const TrainOptions& options);

// --out DIR: creates it and writes and removes a probe file, so that a file in the
// way, a read-only file system or missing permissions fail now, on this rank.
void probe_out_dir(const std::string& dir);

// The resolved options every rank must share, for the rendezvous' comparison: all that
// changes the batches, the numerics, the collectives' schedule or when a rank saves.
// Left out, as they may differ by host: --out and --resume (node-local copies),
// --memory-limit (auto is per host) and --quiet.
dist::AgreedFlags agreed_flags(const TrainOptions& options);

// The "run" object of a checkpoint's state.json: the flags that decide the batches and
// the numerics, and the mesh (informative).
nlohmann::json run_flags(const TrainOptions& options, const plan::Mesh& mesh, int data_rows);

// Compares the checkpoint's "run" object with this run's. Flags that change the batches
// or the numerics (model, data, seed, shuffle, steps, dtype, tokens per step, data rows,
// the optimiser's) are listed with what follows; without `allow` that is an error,
// with it each is a note on `notes` (when not null). Mesh, vision mode, layout and
// checkpoint cadence may change freely. Keys a checkpoint lacks (older runs) are skipped.
void check_resume_flags(const nlohmann::json& then, const nlohmann::json& now, bool allow, const std::string& resume,
                        std::ostream* notes);

}  // namespace mmsp::train
