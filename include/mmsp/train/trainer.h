// The training loop: every step, every rank reads the same sample indices, plans the
// step (plan/), loads only the pixels it encodes, runs the VLM on its shard, and after
// backward reduces the gradients over the world and takes one AdamW step (weight_update.h:
// every parameter replicated, or with --shard, ZeRO-1/2/3, each rank steps its shard).
// Losses and parameters equal one process's on the same batches, whatever the mesh (tests/train).
// The loop's rooms are beside trainer.cpp: run_inputs (the checks and what a run reads),
// trainable (the model parts spread over the mesh, their update), step_memory (the per-step
// preflight), pixel_prefetch, head_loss and agreed_metrics.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mmsp/dist/heartbeat.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/config/config.h"
#include "mmsp/plan/mesh.h"
#include "mmsp/train/memory/memory_estimate.h"
#include "mmsp/train/metrics.h"
#include "mmsp/train/train_options.h"

namespace mmsp::train {

struct TrainReport {
  std::vector<StepMetrics> steps;  // the steps this call ran (every rank holds the same; TrainOptions::report_steps)
  StepSummary summary;             // the same steps folded (always)
  int64_t first_step = 1;          // number of the first of them (> 1 after a resume)
  // the parameters at the end, by Hugging Face name (TrainOptions::report_parameters)
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  // Memory of this rank: the preflight's estimate (with the vision tower of the run's
  // largest step, memory/vision_load.h), and what was allocated when the last
  // step's forward began (the training state held between steps, and the step's batch):
  // the CPU tensor bytes allocated since train() began and still held (train/memory_counter.h).
  MemoryEstimate memory_estimate;
  int64_t held_bytes = 0;
  // ... and what it holds once the last step's update is done and the step's tensors
  // are freed: the training state alone, AdamW's moments included (they appear in the
  // first update, so a one-step run's held_bytes lacks them).
  int64_t state_bytes = 0;
  std::vector<EvalMetrics> evals;  // --eval-data: each evaluation, in order (every rank holds the same)
};

// Checks the options (clear errors naming the flag, the value and the rule, on every rank,
// before any collective).
void check_train_options(const TrainOptions& options, const plan::Mesh& mesh);

// The most tokens per rank (a multiple of `step`) for which the memory preflight's estimate
// of a run of `options` on `world` ranks fits in `capacity_bytes`; 0 when even `step` does
// not. Arithmetic only: nothing is allocated. options.loss_chunk < 0: one chunk of all T.
// ring: the ranks of the context group's ring (0: all of them, the most a Gated DeltaNet
// layer holds; 1: Ulysses over all, where its token mixer runs over sequence tiles).
int64_t longest_tokens_per_rank(const model::ModelConfig& config, const TrainOptions& options, int world,
                                int64_t capacity_bytes, int64_t step = 256, int ring = 0);

// Runs the loop on this rank; rank 0 writes metrics and checkpoints and prints to `log`.
// `activity` (optional) is told the step and phase, for the rank's heartbeat.
TrainReport train(const TrainOptions& options, const dist::Mesh& mesh, std::ostream& log,
                  dist::RankActivity* activity = nullptr);

}  // namespace mmsp::train
