// What the trainer does between a backward and the next forward, and what it saves:
// the gradients summed over the world, clipped, AdamW, the new weights in the model.
// Two ways, chosen by --shard:
//   none       every rank holds the whole optimizer state: parallel::GradSync's bucketed
//              all-reduce, clip_grad_norm, torch's AdamW over the (fp32 master) weights;
//   optimizer, gradients, parameters
//              ZeRO-1/2/3: ShardedAdamW (sharded_adamw.h) over the P-th of it per rank
//              that parallelize installed (parallel/zero/sharded_model.h).
// Both take the same flags and give the same training (fp64: equal to round-off).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "mmsp/dist/heartbeat.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/model/named_params.h"
#include "mmsp/parallel/parallelize.h"
#include "mmsp/parallel/zero/sharded_model.h"
#include "mmsp/train/checkpoint/checkpoint.h"
#include "mmsp/train/optim/optimizer.h"
#include "mmsp/train/optim/sharded_adamw.h"

namespace mmsp::train {

class WeightUpdate {
 public:
  virtual ~WeightUpdate() = default;
  // Before the first step: the weights of a model directory (every weight but LoRA's
  // adapters), or (`adapters`) a peft adapter file's lora_A and lora_B, exactly as stored
  // where the training weights' dtype allows.
  enum class Loaded { base, adapters };
  virtual void load_weights(const hf::HfDirectory& dir, const hf::CheckpointNaming& naming,
                            Loaded which = Loaded::base) = 0;
  // The weights, optimizer state and RNG of a checkpoint (any world size, either layout).
  virtual void restore(const Checkpoint& checkpoint) = 0;
  virtual void set_lr(double lr) = 0;
  // Every rank, before the forward (--shard parameters gathers what the step keeps whole).
  virtual void begin_step() {}
  virtual void zero_grad() = 0;
  // After the backward; returns the gradient norm before clipping (≤ 0: no clipping).
  // `doing` learns the phases (gradient sync, optimizer) for the heartbeat.
  virtual double step(double clip_norm, dist::RankActivity& doing) = 0;
  // The next step() writes the gradients it syncs — summed over the world, before
  // clipping — as a Hugging Face model directory `dir` (the training weights' names and
  // dtype, `config_json` as its config.json): rank 0 writes, every rank learns of a
  // failure. For a comparison against a reference (transformers). The replicated
  // update only: a sharded one holds no whole gradient (refused before it is built).
  virtual void save_next_gradients(const std::string& dir, const std::string& config_json, const dist::Mesh& mesh,
                                   std::ostream& log) = 0;
  // Every rank calls; the checkpoint is complete when it returns on any rank, and a
  // failure on one rank is an error on all.
  virtual void save(const std::string& dir, int64_t step, const nlohmann::json& state, const std::string& config_json,
                    CheckpointOptions options, const dist::Mesh& mesh, std::ostream& log) = 0;
  // The training weights by name (the masters where they are whole; else the model's).
  // With --shard parameters the hooked units' weights are empty between uses: call
  // gather_weights() (every rank) before reading their values.
  virtual model::NamedParams weights() const = 0;
  virtual void gather_weights() {}
  // Every rank: the whole model's training weights, the other ranks' experts gathered
  // under expert parallelism (else weights()).
  virtual model::NamedParams whole_weights() { return weights(); }
  // For the start-up line: "fp32 master weights", "optimizer state sharded over 4 ranks".
  virtual std::string describe() const = 0;
};

// `model_params`: the model's parameters in its compute dtype; master_dtype: the
// optimizer's (fp32 for a bf16 model: mixed precision). `parallelism`: what
// parallel::parallelize installed: its ZeRO sharding, stepped by a ShardedAdamW, or none
// (the replicated update, whose gradients sum over parallelism.data).
// `frozen`: the model's parameters that do not train (--freeze): no master, no optimizer
// state, no gradient sum; the update loads them, saves them into every checkpoint's hf/
// (a whole model directory) beside the trained ones and restores them, and weights()
// lists them after the trained ones.
std::unique_ptr<WeightUpdate> make_weight_update(model::NamedParams model_params, at::ScalarType master_dtype,
                                                 const AdamWOptions& options, const dist::Mesh& mesh,
                                                 const parallel::ModelParallelism& parallelism,
                                                 model::NamedParams frozen = {});

}  // namespace mmsp::train
