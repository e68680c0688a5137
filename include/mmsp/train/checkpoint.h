// Training checkpoints: a directory per step that holds the model (safetensors with
// Hugging Face names), the AdamW state by parameter name, the trainer's position
// and RNG, and the model's config.json; saved atomically, loaded on any rank.
// Which step to save, and that only rank 0 saves, is the trainer's business.
//
//   DIR/latest                  text: the newest complete step dir's name
//   DIR/step-000042/model.safetensors       every parameter by name (HF names)
//                   optimizer.safetensors   <param>.exp_avg, <param>.exp_avg_sq
//                                           (+ .max_exp_avg_sq), groups and step
//                                           counts in the metadata (optimizer_state.h)
//                   state.json              step, data position, RNG, run (train_state.h)
//                   config.json             the HF model config text, as given
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <map>
#include <string>

#include "mmsp/train/optimizer_state.h"
#include "mmsp/train/train_state.h"

namespace mmsp::train {

// Exit status of a save killed by CheckpointOptions::crash_after_bytes.
constexpr int kCheckpointCrashExitCode = 86;

struct CheckpointOptions {
  // Step dirs to keep, the new one included; older ones (by step, up to the saved
  // step; later ones are left alone) are deleted after the new one is complete.
  // 0 keeps all.
  int keep_last = 0;
  // TEST HOOK (crash tests only; −1 = off): with n ≥ 0 the save calls
  // std::_Exit(kCheckpointCrashExitCode) right after it has written n bytes in total
  // across the checkpoint's files (in write order: model.safetensors,
  // optimizer.safetensors, state.json, config.json, latest), usually mid-file.
  int64_t crash_after_bytes = -1;
};

// "step-000042" (at least six digits).
std::string step_dir_name(int64_t step);

// Writes DIR/step-<step> atomically. `state` is the trainer's position as
// train_state.h describes it: "data" and "run" are required; "step", when present,
// must equal `step` (else it is set); an absent "cpu_rng" is captured now.
// `config_json` must be a JSON object (the HF config text, stored as given).
// Steps: remove leftover DIR/.*.tmp-* from crashed saves; write every file into
// DIR/.step-<step>.tmp-<pid>, each fsync'd; fsync that dir; move it to
// DIR/step-<step> (swapping out an existing one); fsync DIR; replace DIR/latest
// (temp file, fsync, rename, fsync DIR); apply keep_last. A crash at any point
// leaves `latest` naming a complete checkpoint (or absent before the first).
void save_checkpoint(const std::string& dir, int64_t step, const torch::nn::Module& model,
                     const torch::optim::AdamW& optimizer, const nlohmann::json& state,
                     const std::string& config_json, const CheckpointOptions& options = {});

// A checkpoint read into memory (CPU tensors, the files' dtypes).
struct Checkpoint {
  std::string path;      // the step dir read
  int64_t step = 0;      // optimiser steps taken; training resumes after this step
  nlohmann::json state;  // state.json, checked (train_state.h)
  std::string config_json;
  std::map<std::string, at::Tensor> model;  // parameter name -> tensor
  AdamWState optimizer;
};

// Reads `path`: a checkpoint dir (follows its `latest`) or a step dir. Checks each
// file and their agreement; errors name the file, the value and the rule.
Checkpoint load_checkpoint(const std::string& dir_or_step_dir);

// Copies the weights into `model`, the AdamW state and group options into
// `optimizer` (built over `model`'s parameters, e.g. by make_adamw) and the RNG state
// into the default CPU generator. The parameter names must match exactly: a
// missing, extra or differently shaped tensor is an error naming it. Everything is
// checked before anything changes.
void restore(const Checkpoint& checkpoint, torch::nn::Module& model,
             torch::optim::AdamW& optimizer);

}  // namespace mmsp::train
