// Training checkpoints: a directory per step that holds the model as a Hugging Face
// model directory (transformers' from_pretrained and `mmsp train --model` read it
// unchanged), the exact training weights when those are in another dtype, the AdamW
// state by parameter name, and the trainer's position and RNG; saved atomically,
// loaded on any rank. Which step to save, and that only rank 0 saves, is the
// trainer's business.
//
//   DIR/latest                  text: the newest complete step dir's name
//   DIR/step-000042/hf/         config.json + model.safetensors, or shards
//                               model-0000k-of-0000n.safetensors + index, in the
//                               save dtype (hf/hf_directory.h)
//                   master/     the same layout in the training weights' own dtype
//                               (fp32 masters of a bf16 run); only when hf/ holds
//                               another dtype, so a resume is always exact
//                   optimizer/              instead, with --shard optimizer: one file per
//                                           rank, masters and moments in pieces
//                                           (sharded_checkpoint.h); then no master/
//                   optimizer.safetensors   <param>.exp_avg, <param>.exp_avg_sq
//                                           (+ .max_exp_avg_sq), groups and step
//                                           counts in the metadata (optimizer_state.h)
//                   state.json              step, data position, RNG, run (train_state.h)
//                   checksums.json          written last: XXH64 and size of optimizer.safetensors,
//                                           state.json, hf/checksums.json, master/checksums.json
//                                           (which cover hf/ and master/), format version 1;
//                                           load_checkpoint verifies every file before reading
//                                           (hf/checksum_manifest.h)
// Checkpoints of the first format (model.safetensors + config.json beside state.json)
// are still read.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mmsp/hf/checksum_manifest.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/model/named_params.h"
#include "mmsp/train/checkpoint/sharded_checkpoint.h"
#include "mmsp/train/checkpoint/train_state.h"
#include "mmsp/train/optim/optimizer_state.h"
#include "mmsp/train/optim/sharded_adamw.h"

namespace mmsp::train {

// Exit status of a save killed by CheckpointOptions::crash_after_bytes.
constexpr int kCheckpointCrashExitCode = 86;

struct CheckpointOptions {
  // Step dirs to keep, the new one included; older ones (by step, up to the saved
  // step; later ones are left alone) are deleted after the new one is complete.
  // 0 keeps all.
  int keep_last = 0;
  // hf/'s dtype (floating tensors); unset: each weight's own dtype (then no master/).
  std::optional<at::ScalarType> save_dtype;
  // Largest shard of hf/ and master/ (transformers' max_shard_size).
  uint64_t max_shard_bytes = hf::kHfDefaultShardBytes;
  // TEST HOOK (crash tests only; −1 = off): with n ≥ 0 the save calls
  // std::_Exit(kCheckpointCrashExitCode) right after it has written n bytes in total
  // across the checkpoint's files (in write order: hf/ (config.json, the shards,
  // the index), master/ likewise, optimizer.safetensors, state.json, latest),
  // usually mid-file.
  int64_t crash_after_bytes = -1;
  // TEST HOOK (crash tests only): the --keep rotation exits the process
  // (kCheckpointCrashExitCode) right after it has renamed the first step dir it deletes,
  // as a kill between the rename and the deletion would.
  bool crash_in_keep = false;
  // Sharded optimizer state (--shard optimizer): every rank has written its file
  // (optimizer_shard_file) into this directory, with these checksums by file name. The
  // save moves the directory into the step dir as optimizer/ instead of writing
  // optimizer.safetensors, and writes no master/ (the shards hold the exact masters).
  // It must be DIR/.step-<step>.tmp-shards (shard_staging_dir), which the save's
  // clean-up of crashed saves spares.
  std::string optimizer_shards_staged;
  hf::ChecksumManifest optimizer_shard_checksums;
  // LoRA (--lora-rank): hf/ holds these instead (the merged model transformers reads, by the
  // base's names), master/ then always holds the weights (the base and the adapters, exact,
  // for --resume), and `extra` writes more into the step dir before its checksums (adapter/:
  // peft's directory), each file it writes listed in the manifest it returns (paths relative
  // to the step dir).
  std::optional<model::NamedParams> hf_weights;
  std::function<hf::ChecksumManifest(const std::string& step_dir)> extra;
};

// Where the ranks of a sharded save write their optimizer files before rank 0's save.
std::string shard_staging_dir(const std::string& dir, int64_t step);

// "step-000042" (at least six digits).
std::string step_dir_name(int64_t step);

// Writes DIR/step-<step> atomically. `state` is the trainer's position as
// train_state.h describes it: "data" and "run" are required; "step", when present,
// must equal `step` (else it is set); an absent "cpu_rng" is captured now.
// `weights` are the training weights by HF name (the masters of a mixed-precision
// run). `config_json` must be a JSON object (the HF config text; hf/config.json
// gets "torch_dtype" set to the saved dtype). Steps: remove leftover DIR/.*.tmp-* from crashed saves; write every file
// into DIR/.step-<step>.tmp-<pid>, each fsync'd; fsync that dir; move it to DIR/step-<step> (swapping out an existing
// one); fsync DIR; replace DIR/latest (temp file, fsync, rename, fsync DIR); apply keep_last. A crash at any point
// leaves `latest` naming a complete checkpoint (or absent before the first).
void save_checkpoint(const std::string& dir, int64_t step, const model::NamedParams& weights,
                     const torch::optim::AdamW& optimizer, const nlohmann::json& state, const std::string& config_json,
                     const CheckpointOptions& options = {});
// The same from AdamW's state by name (expert parallelism: the experts of every rank
// gathered into one state).
void save_checkpoint(const std::string& dir, int64_t step, const model::NamedParams& weights, const AdamWState& adamw,
                     const nlohmann::json& state, const std::string& config_json,
                     const CheckpointOptions& options = {});
// A sharded save: the optimizer state is in options.optimizer_shards_staged.
void save_checkpoint(const std::string& dir, int64_t step, const model::NamedParams& weights,
                     const nlohmann::json& state, const std::string& config_json, const CheckpointOptions& options);
// The same for every parameter of `model`.
void save_checkpoint(const std::string& dir, int64_t step, const torch::nn::Module& model,
                     const torch::optim::AdamW& optimizer, const nlohmann::json& state, const std::string& config_json,
                     const CheckpointOptions& options = {});

// A checkpoint, checked: its small files in memory, its weights' headers opened (the
// weights themselves are read by restore, straight into the parameters).
struct Checkpoint {
  std::string path;                                 // the step dir read
  int64_t step = 0;                                 // optimiser steps taken; training resumes after this step
  nlohmann::json state;                             // state.json, checked (train_state.h)
  std::string config_json;                          // the model's config (hf/config.json)
  hf::HfDirectory weights;                          // master/ when present, else hf/ (exact training weights)
  std::map<std::string, at::Tensor> legacy_model;   // first format only: model.safetensors
  AdamWState optimizer;                             // optimizer.safetensors; empty when the state is sharded
  std::optional<OptimizerShards> optimizer_shards;  // optimizer/ of a sharded run
  std::vector<std::string> notes;                   // for the user: e.g. an older checkpoint read unverified
  std::string manifest_xxh64;                       // checksums.json's own checksum: the whole checkpoint's identity
};

// Reads `path`: a checkpoint dir (follows its `latest`) or a step dir. Checks each
// file and their agreement; errors name the file, the value and the rule.
Checkpoint load_checkpoint(const std::string& dir_or_step_dir);

// Copies the weights into `model`, the AdamW state and group options into
// `optimizer` (built over `model`'s parameters, e.g. by make_adamw) and the RNG state
// into the default CPU generator. The parameter names must match exactly: a
// missing, extra or differently shaped tensor is an error naming it. Everything is
// checked before anything changes.
void restore(const Checkpoint& checkpoint, const model::NamedParams& weights, torch::optim::AdamW& optimizer);
void restore(const Checkpoint& checkpoint, torch::nn::Module& model, torch::optim::AdamW& optimizer);

// The same into a sharded optimizer over the model's parameters: each rank reads only
// the ranges it owns (masters from the shards, or from the weights of an unsharded
// checkpoint), whatever the world size of the saving run. `frozen`: weights outside the
// optimizer (--freeze), read whole from the checkpoint's weights. (The replicated restore
// above takes them among `weights`: those its optimizer does not hold.)
void restore(const Checkpoint& checkpoint, ShardedAdamW& optimizer, const model::NamedParams& frozen = {});
// Several sharded optimizers of one model (expert parallelism: the dense weights' and this
// rank's experts', each piece read at its whole offset), the checkpoint's weights matched
// to theirs by `naming` (model::add_expert_shard: this rank's rows of a fused expert
// tensor, the other ranks' experts held elsewhere).
void restore(const Checkpoint& checkpoint, const std::vector<ShardedAdamW*>& optimizers,
             const model::NamedParams& frozen, const hf::CheckpointNaming& naming);

// Two configs are the same model when equal as JSON apart from "torch_dtype" (which
// a save rewrites).
bool same_model_config(const std::string& a_json, const std::string& b_json);

}  // namespace mmsp::train
