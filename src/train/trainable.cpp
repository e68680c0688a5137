// The model parts and their update; see trainable.h.
#include "trainable.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "mmsp/core/check.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/model/lora.h"
#include "mmsp/model/model_parts.h"
#include "mmsp/model/named_params.h"
#include "mmsp/model/peft_naming.h"

namespace mmsp::train {

parallel::ParallelizeOptions parallelize_options(const TrainOptions& o, const dist::Mesh& mesh) {
  parallel::ParallelizeOptions spread;
  spread.checkpoint_activations = o.memory.checkpoint_activations;
  spread.offload_activations = o.memory.offload_activations;
  spread.mlp_tile = o.memory.tiled_mlp;
  spread.shard = o.parallel.shard;
  spread.master_dtype = master_dtype_of(o.inputs.dtype);
  spread.data = mesh.world();
  spread.expert_data = mesh.expert_replica();
  spread.groups = {mesh.context(), mesh.ring(), mesh.ulysses(), mesh.world(), mesh.expert()};
  spread.vision = o.parallel.vision;
  spread.attention.block_q = o.parallel.attention_block;
  spread.attention.block_k = o.parallel.attention_block;
  spread.attention.kernel = o.parallel.attention_kernel;
  spread.overlap_communication = o.parallel.overlap_communication;
  return spread;
}

namespace {

// --freeze: the parts' parameters stop requiring a gradient (before parallelize, so that
// ZeRO shards only the rest); with LoRA every parameter but the adapters'. Returns them.
model::NamedParams freeze_parts(const model::Vlm& vlm, const FinetuneOptions& f) {
  model::NamedParams frozen;
  if (f.freeze.empty() && f.lora.rank == 0) return frozen;
  const model::NamedParams params = model::named_parameters(vlm);
  const std::vector<model::ModelPart> part_of = model::parameter_parts(vlm, params);
  for (size_t i = 0; i < params.size(); ++i) {
    const bool freeze = f.lora.rank > 0 ? !model::is_lora_parameter(params[i].first)
                                        : std::find(f.freeze.begin(), f.freeze.end(), part_of[i]) != f.freeze.end();
    if (!freeze) continue;
    params[i].second.requires_grad_(false);
    frozen.push_back(params[i]);
  }
  return frozen;
}

// --lora-rank: the adapters, drawn from the seed after the model (the same on every rank, and
// drawn even when the base weights are about to be loaded).
void add_adapters(model::Vlm& vlm, const TrainOptions& o) {
  if (o.finetune.lora.rank == 0) return;
  model::ParameterInitScope init(model::ParameterInit::random, o.inputs.dtype);
  model::add_lora(vlm, o.finetune.lora);
}

}  // namespace

Trainable build_trainable(const TrainOptions& o, const RunInputs& in, const dist::Mesh& mesh,
                          std::optional<attention::AttentionKernel> decoder_kernel) {
  at::manual_seed(static_cast<int64_t>(o.inputs.seed));  // identical replicas on every rank
  // Weights about to be loaded (a model directory, a checkpoint) need no random draw.
  const bool loading = in.resolved.weights || in.checkpoint.has_value();
  Trainable t;
  t.model_parts.push_back(build_vlm(in.resolved.config,
                                    loading ? model::ParameterInit::uninitialised : model::ParameterInit::random,
                                    o.inputs.dtype));
  add_adapters(*t.model_parts.back(), o);
  parallel::ParallelizeOptions spread = parallelize_options(o, mesh);
  if (decoder_kernel) spread.attention.kernel = *decoder_kernel;
  model::NamedParams params, frozen;
  for (const std::shared_ptr<model::Vlm>& part : t.model_parts) {
    // The buffers (rotary tables) into the dtype, everything onto the rank's device; the
    // masters and optimizer state below follow the parameters there.
    part->to(o.parallel.device, o.inputs.dtype);
    for (auto& named : freeze_parts(*part, o.finetune)) frozen.push_back(named);
    t.parallelisms.push_back(parallel::parallelize(*part, spread));
    t.installed.emplace_back(part);
    for (auto& named : model::named_parameters(*part))
      if (named.second.requires_grad()) params.push_back(named);
  }
  MMSP_ASSERT(t.model_parts.size() == 1, "a run is one model part until pipeline stages exist");
  AdamWOptions adamw;
  adamw.lr = o.schedule.lr;
  adamw.beta1 = o.schedule.beta1;
  adamw.beta2 = o.schedule.beta2;
  adamw.eps = o.schedule.eps;
  adamw.weight_decay = o.schedule.weight_decay;
  t.update = make_weight_update(std::move(params), master_dtype_of(o.inputs.dtype), adamw, mesh, t.parallelism(),
                                std::move(frozen));
  if (in.resolved.weights && !in.checkpoint)  // a resume reads the checkpoint's weights instead
    t.update->load_weights(*in.resolved.weights, in.naming);
  if (in.adapter && !in.checkpoint)  // --model ADAPTER_DIR: the adapters start as peft saved them
    t.update->load_weights(in.adapter->weights, model::peft_adapter_naming(in.resolved.config),
                           WeightUpdate::Loaded::adapters);
  return t;
}

}  // namespace mmsp::train
