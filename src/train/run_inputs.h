// What a run is made of, checked before anything is allocated: the model, its dtypes, the
// memory it needs, the data and the packer of the steps. Everything that can be wrong with
// the options, the model or the data fails in check_run, on every rank alike, before the
// first collective. Private to train/ (trainer.cpp and its rooms).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "eval_run.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/hf/peft_adapter.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/model/vlm.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/builtin_models.h"
#include "mmsp/train/checkpoint/checkpoint.h"
#include "mmsp/train/data/dataset.h"
#include "mmsp/train/data/step_packer.h"
#include "mmsp/train/memory/memory_estimate.h"
#include "mmsp/train/trainer.h"

namespace mmsp::train {

struct RunInputs {
  ResolvedModel resolved;
  std::optional<at::ScalarType> save_dtype;  // hf/ of the checkpoints: as asked, else as the weights came
  int64_t loss_chunk = 0;                    // tokens per chunk of the LM head and loss (the default resolved)
  hf::CheckpointNaming naming;
  // --model ADAPTER_DIR: the peft adapter the LoRA adapters start from, its tensors matched.
  std::optional<hf::PeftAdapterFiles> adapter;
  ParameterLayout layout;  // every parameter's shape and unit, from the skeleton (each step's estimate reads them)
  MemoryEstimate memory;
  std::unique_ptr<Dataset> data;
  int rows = 1;  // rows of the packer (InputOptions::data_rows)
  std::unique_ptr<StepPacker> packer;
  EvalSet eval;  // --eval-data: the held-out file and its steps (none without it)
  // --resume's checkpoint, verified (none for a fresh run, and for a requeued job's
  // --resume of its own --out that holds no checkpoint yet: it starts afresh).
  std::optional<Checkpoint> checkpoint;
  std::string resume_note;  // said by rank 0 when --resume found nothing to resume
};

RunInputs check_run(const TrainOptions& options, const dist::Mesh& mesh);

// How every step of a run is planned: the mesh, layout, placement and vision split, the
// load report's attention bytes priced for this model and dtype.
plan::PlanOptions plan_options_for(const TrainOptions& o, const RunInputs& in, const dist::Mesh& mesh);

// The config's family from the registry, parameters drawn as `mode` says, made in `dtype`.
std::shared_ptr<model::Vlm> build_vlm(const model::ModelConfig& config, model::ParameterInit mode,
                                      at::ScalarType dtype = at::kFloat);

// Every parameter's name and shape, its hooked unit and whether --freeze freezes it, from a
// skeleton of meta tensors.
ParameterLayout layout_of(const model::ModelConfig& config, const FinetuneOptions& finetune = {});

// This rank's memory for a run of `options` on `mesh`. `local_length`: a step's padded slots
// a rank holds, when known (0: --tokens-per-rank).
MemoryEstimate estimate_for(const model::ModelConfig& config, const ParameterLayout& layout, const TrainOptions& o,
                            int64_t loss_chunk, const plan::Mesh& mesh, int64_t local_length = 0);

}  // namespace mmsp::train
