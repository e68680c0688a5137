// The run's checks and what it reads; see run_inputs.h.
#include "run_inputs.h"

#include <algorithm>
#include <filesystem>

#include "mmsp/core/check.h"
#include "mmsp/model/checkpoint_naming.h"
#include "mmsp/model/family.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/model/lora.h"
#include "mmsp/model/model_parts.h"
#include "mmsp/model/named_params.h"
#include "mmsp/model/peft_naming.h"
#include "mmsp/train/checkpoint/run_directory.h"
#include "mmsp/train/data/jsonl_dataset.h"
#include "mmsp/train/data/shapes_dataset.h"
#include "mmsp/train/loss/chunked_loss.h"
#include "mmsp/train/run_checks.h"

namespace mmsp::train {

std::shared_ptr<model::Vlm> build_vlm(const model::ModelConfig& config, model::ParameterInit mode,
                                      at::ScalarType dtype) {
  model::ParameterInitScope init(mode, dtype);
  return model::build_vlm(config);
}

ParameterLayout layout_of(const model::ModelConfig& config, const FinetuneOptions& f) {
  const std::shared_ptr<model::Vlm> skeleton = build_vlm(config, model::ParameterInit::meta);
  if (f.lora.rank > 0) {
    model::ParameterInitScope meta(model::ParameterInit::meta);  // the adapters as shapes too
    model::add_lora(*skeleton, f.lora);
  }
  ParameterLayout layout = parameter_layout(*skeleton);
  if (f.freeze.empty() && f.lora.rank == 0) return layout;
  const model::NamedParams params = model::named_parameters(*skeleton);
  const std::vector<model::ModelPart> parts = model::parameter_parts(*skeleton, params);
  for (size_t i = 0; i < params.size(); ++i)
    layout.frozen.push_back(f.lora.rank > 0 ? !model::is_lora_parameter(params[i].first)
                                            : std::find(f.freeze.begin(), f.freeze.end(), parts[i]) != f.freeze.end());
  return layout;
}

// The shapes a file must hold: a model directory every parameter's but LoRA's adapters', a
// peft adapter file (`adapters`) exactly the adapters'.
hf::ExpectedShapes shapes_to_load(const ParameterLayout& layout, bool adapters) {
  hf::ExpectedShapes out;
  for (const auto& named : layout.shapes)
    if (model::is_lora_parameter(named.first) == adapters) out.push_back(named);
  return out;
}

namespace {

// --freeze must leave something to train.
void check_freeze(const TrainOptions& o, const model::ModelConfig& config, const ParameterLayout& layout) {
  MMSP_CHECK(o.finetune.lora.rank == 0 || o.finetune.freeze.empty(), "--freeze ", model::to_string(o.finetune.freeze),
             " with --lora-rank ", o.finetune.lora.rank,
             ": LoRA freezes every weight but its adapters already; leave --freeze out (adapt the vision tower "
             "with --lora-targets vision.NAME)");
  if (o.finetune.freeze.empty()) return;
  const std::string flag = "--freeze " + model::to_string(o.finetune.freeze);
  MMSP_CHECK(std::find(layout.frozen.begin(), layout.frozen.end(), false) != layout.frozen.end(), flag,
             " freezes every parameter of ", o.inputs.model, " (", config.model_type,
             "): nothing would train; leave at least one of vision, merger, llm, embeddings out");
}

}  // namespace

MemoryEstimate estimate_for(const model::ModelConfig& config, const ParameterLayout& layout, const TrainOptions& o,
                            int64_t loss_chunk, const plan::Mesh& mesh, int64_t local_length) {
  MemoryEstimateInputs in;
  in.compute_dtype = o.inputs.dtype;
  in.master_dtype = master_dtype_of(o.inputs.dtype);
  in.tokens_per_rank = o.inputs.tokens_per_rank;
  in.local_length = local_length;
  in.attention_block = o.parallel.attention_block;
  in.loss_chunk = loss_chunk;
  in.checkpointing = o.memory.checkpoint_activations;
  in.offload_activations =
      o.memory.offload_activations && o.parallel.device.is_cuda();  // on the CPU the host is the device
  in.mlp_tile = model::mlp_tile_tokens(o.memory.tiled_mlp, std::max(o.inputs.tokens_per_rank, local_length),
                                       config.text.hidden_size);
  in.shard_level = o.parallel.shard;
  if (in.shard_level != parallel::ShardLevel::none) {
    in.shard_world = mesh.world();
    in.expert_shard_world = mesh.world() / mesh.expert;  // expert parallelism: the experts over their replicas
  }
  in.ring = mesh.ring;
  in.ulysses = mesh.ulysses;
  return estimate_memory(config, layout, in);
}

namespace {

// `row_tokens`: the most tokens one row of a step holds; a data line too long to hold a
// sample that fits is refused before it is parsed (JsonlDataset's max_line_bytes).
std::unique_ptr<Dataset> make_dataset(const TrainOptions& o, const model::ModelConfig& config, int64_t row_tokens) {
  const InputOptions& i = o.inputs;
  if (i.data == "shapes") {
    ShapesOptions shapes;
    shapes.seed = i.seed;
    shapes.samples = i.shapes_samples;
    shapes.blank_images = i.blank_images;
    shapes.max_sequence_tokens = row_tokens;  // so a long run never meets a sample no row holds
    return std::make_unique<ShapesDataset>(shapes, config);
  }
  MMSP_CHECK(!i.blank_images, "--blank-images applies to the built-in shapes dataset only, not '", i.data, "'");
  return std::make_unique<JsonlDataset>(i.data, config, i.max_image_pixels, JsonlDataset::line_bytes_for(row_tokens));
}

void check_inputs(const InputOptions& i, const plan::Mesh& mesh) {
  MMSP_CHECK(i.tokens_per_rank > 0, "--tokens-per-rank ", i.tokens_per_rank, " must be positive");
  MMSP_CHECK(i.data_rows >= 0, "--data-rows ", i.data_rows, " must be ≥ 0");
  const int rows = i.data_rows > 0 ? i.data_rows : mesh.dp;
  MMSP_CHECK(i.tokens_per_rank * mesh.world() % rows == 0, "--tokens-per-rank ", i.tokens_per_rank, " × world ",
             mesh.world(), " must divide into --data-rows ", rows, " equal rows");
  MMSP_CHECK(i.shapes_samples > 0, "--shapes-samples ", i.shapes_samples, " must be positive");
}

void check_memory_options(const MemoryOptions& m) {
  MMSP_CHECK(m.limit_bytes >= 0, "--memory-limit ", m.limit_bytes, " must be ≥ 0 (0: no check)");
  MMSP_CHECK(!m.offload_activations || m.checkpoint_activations != model::ActivationCheckpointing::none,
             "--offload-activations keeps the inputs of recomputed layers in host memory: it needs "
             "--checkpoint-activations decoder or all, not none");
  MMSP_CHECK(m.tiled_mlp >= model::kAutoMlpTile, "--tiled-mlp ", m.tiled_mlp,
             " must be off (0), auto or a number of tokens per tile >= 1");
  MMSP_CHECK(m.loss_chunk >= 0, "--loss-chunk ", m.loss_chunk,
             " must be ≥ 0 (tokens per chunk of the LM head and loss; 0: the default, ≤ 256 MiB of logits)");
}

void check_schedule(const ScheduleOptions& s) {
  MMSP_CHECK(s.steps > 0, "--steps ", s.steps, " must be positive");
  MMSP_CHECK(s.lr > 0 && s.min_lr >= 0 && s.min_lr <= s.lr, "--lr ", s.lr, " and --min-lr ", s.min_lr,
             " must satisfy 0 ≤ min-lr ≤ lr, lr > 0");
  MMSP_CHECK(s.warmup >= 0, "--warmup ", s.warmup, " must be ≥ 0");
  MMSP_CHECK(s.stop_after >= 0, "--stop-after ", s.stop_after, " must be ≥ 0");
  MMSP_CHECK(s.weight_decay >= 0, "--weight-decay ", s.weight_decay, " must be ≥ 0");
  // AdamW moves each weight by about lr per step: above 1 a step outweighs the weights
  // themselves (1e308 overflowed only after step 1). Decoupled decay scales the weights
  // by 1 − lr × weight_decay: above 1 it flips their sign.
  MMSP_CHECK(s.lr <= kMaxLr, "--lr ", s.lr, " is beyond ", kMaxLr,
             ": AdamW moves every weight by about lr per step (fine-tuning uses 1e-6 to 1e-3)");
  MMSP_CHECK(s.lr * s.weight_decay <= 1, "--lr ", s.lr, " × --weight-decay ", s.weight_decay,
             " must be ≤ 1: decoupled weight decay multiplies the weights by 1 − lr × weight_decay");
  MMSP_CHECK(s.clip >= 0, "--clip ", s.clip, " must be ≥ 0 (the global gradient norm to clip to; 0: off)");
  MMSP_CHECK(s.accumulate >= 1, "--accumulate ", s.accumulate, " must be ≥ 1 (micro-steps per optimizer step)");
}

void check_output(const OutputOptions& out, parallel::ShardLevel shard) {
  MMSP_CHECK(out.save_shard_bytes > 0, "--save-shard-size ", out.save_shard_bytes, " must be positive");
  MMSP_CHECK(out.checkpoint_every >= 0, "--checkpoint-every ", out.checkpoint_every, " must be ≥ 0");
  MMSP_CHECK(out.checkpoint_every == 0 || !out.out.empty(), "--checkpoint-every needs --out DIR");
  MMSP_CHECK(out.keep >= 0, "--keep ", out.keep, " must be ≥ 0");
  MMSP_CHECK(out.save_gradients.empty() || shard == parallel::ShardLevel::none,
             "--save-gradients needs --shard none (with --shard ", parallel::to_string(shard),
             " no rank holds the whole gradient)");
  if (!out.save_gradients.empty()) {
    std::error_code ec;
    MMSP_CHECK(!std::filesystem::exists(out.save_gradients, ec) || std::filesystem::is_empty(out.save_gradients, ec),
               "--save-gradients ", out.save_gradients, " exists and is not empty (nothing in it is overwritten)");
  }
}

// This rank's memory for the run; refused (naming every part) when over the limit.
MemoryEstimate preflight_memory(const model::ModelConfig& config, const ParameterLayout& layout, const TrainOptions& o,
                                int64_t loss_chunk, const plan::Mesh& mesh) {
  const MemoryEstimate memory = estimate_for(config, layout, o, loss_chunk, mesh);
  check_memory_fits(memory, o.memory.limit_bytes, o.memory.limit_source);
  return memory;
}

// The packer of the steps: the budget split data_rows ways (see InputOptions::data_rows).
void open_data(const TrainOptions& o, const dist::Mesh& mesh, RunInputs& in) {
  in.rows = o.inputs.data_rows > 0 ? o.inputs.data_rows : mesh.shape().dp;
  in.data = make_dataset(o, in.resolved.config, o.inputs.tokens_per_rank * mesh.world_size() / in.rows);
  const ObjectiveOptions& j = o.objective;
  if (!j.old_logprobs_file.empty() || !j.ref_logprobs_file.empty()) {
    auto* jsonl = dynamic_cast<JsonlDataset*>(in.data.get());
    MMSP_CHECK(jsonl, "--old-logprobs and --ref-logprobs join a .jsonl --data's samples, not --data ", o.inputs.data);
    if (!j.old_logprobs_file.empty()) jsonl->attach_logprobs(j.old_logprobs_file, false, "--old-logprobs");
    if (!j.ref_logprobs_file.empty()) jsonl->attach_logprobs(j.ref_logprobs_file, true, "--ref-logprobs");
  }
  PackerOptions packing;
  packing.tokens_per_row = o.inputs.tokens_per_rank * mesh.world_size() / in.rows;
  packing.rows = in.rows;
  packing.seed = o.inputs.seed;
  packing.shuffle = o.inputs.shuffle;
  packing.group = o.objective.kind == Objective::dpo ? 2 : 1;  // a pair's sides share a step
  in.packer = std::make_unique<StepPacker>(*in.data, packing);
  if (const auto* jsonl = dynamic_cast<const JsonlDataset*>(in.data.get()))
    jsonl->check_lengths(in.packer->row_limit());
  in.eval = open_eval_set(o, in.resolved.config, packing.tokens_per_row, in.rows);
}

}  // namespace

void check_train_options(const TrainOptions& o, const plan::Mesh& mesh) {
  check_train_limits(o);  // upper bounds first: nothing below may overflow
  MMSP_CHECK(o.finetune.lora.rank >= 0, "--lora-rank ", o.finetune.lora.rank,
             " must be ≥ 1 (the adapters' rank; 0 in the options: no LoRA)");
  check_inputs(o.inputs, mesh);
  MMSP_CHECK(o.parallel.attention_block > 0, "--attention-block ", o.parallel.attention_block, " must be positive");
  check_memory_options(o.memory);
  check_schedule(o.schedule);
  check_output(o.output, o.parallel.shard);
  check_objective_options(o.objective);
}

plan::PlanOptions plan_options_for(const TrainOptions& o, const RunInputs& in, const dist::Mesh& mesh) {
  plan::PlanOptions p;
  p.mesh = mesh.shape();
  p.layout = o.parallel.layout;
  p.placement = o.parallel.placement;
  p.placement_balance = o.parallel.placement_balance;
  p.vision_split = o.parallel.vision_split;
  p.attention_shape =
      model::attention_shape(in.resolved.config.text, static_cast<int64_t>(c10::elementSize(o.inputs.dtype)));
  return p;
}

RunInputs check_run(const TrainOptions& o, const dist::Mesh& mesh) {
  check_train_options(o, mesh.shape());
  RunInputs in;
  in.resolved = resolve_model(o.inputs.model);
  const model::ModelConfig& config = in.resolved.config;
  in.loss_chunk = o.memory.loss_chunk > 0 ? o.memory.loss_chunk : default_loss_chunk(config.text.vocab_size);
  const plan::Mesh& shape = mesh.shape();
  MMSP_CHECK(config.text.num_attention_heads % shape.ulysses == 0, o.inputs.model, ": ",
             config.text.num_attention_heads, " attention heads cannot be split over ulysses ", shape.ulysses,
             " (the degree must divide the head count)");
  MMSP_CHECK(shape.expert == 1 || config.text.moe.any(), "--expert ", shape.expert,
             " splits the experts of a mixture-of-experts model; ", o.inputs.model, " (", config.model_type,
             ") has none: leave --expert at 1");
  MMSP_CHECK(shape.expert == 1 || (o.finetune.freeze.empty() && o.finetune.lora.rank == 0), "--expert ", shape.expert,
             " with --freeze or --lora-rank is not supported yet (frozen and adapted weights are not split over the "
             "expert groups): use --expert 1 to fine-tune parts of a mixture-of-experts model");
  MMSP_CHECK(shape.expert == 1 || o.output.resume.empty() || o.parallel.shard != parallel::ShardLevel::none,
             "--resume with --expert ", shape.expert,
             " needs a --shard level (the sharded optimizer reads this rank's experts' ranges of the "
             "checkpoint; the replicated one reads whole tensors): add --shard optimizer, or resume with --expert 1");
  // This rank builds, loads and steps its block's experts only (expert parallelism).
  model::set_expert_shard(in.resolved.config.text.moe, shape.expert, mesh.rank() % shape.expert);
  MMSP_CHECK(o.memory.tiled_mlp == 0 || !config.text.moe.any(), "--tiled-mlp is not supported for ", o.inputs.model,
             " (", config.model_type, "): its mixture-of-experts layers route every token at once");
  // The weights' names and shapes, the checkpoint's mapping and the memory this run
  // needs are all checked on a skeleton, before a parameter is allocated.
  in.layout = layout_of(config, o.finetune);
  check_freeze(o, config, in.layout);
  in.naming = model::checkpoint_naming(config);
  if (in.resolved.weights) {
    model::check_expert_count(*in.resolved.weights, config);
    hf::match_hf_tensors(*in.resolved.weights, shapes_to_load(in.layout, false), in.naming);
  }
  if (!o.finetune.lora_adapter.empty()) {
    in.adapter = hf::open_peft_adapter(o.finetune.lora_adapter);
    try {
      hf::match_hf_tensors(in.adapter->weights, shapes_to_load(in.layout, true), model::peft_adapter_naming(config));
    } catch (const Error& e) {
      throw Error(detail::concat(
          "--model ", o.finetune.lora_adapter, ": its adapters are not the ones mmsp puts on every map named ",
          model::lora_targets_text(o.finetune.lora.targets), " of ", o.inputs.model,
          " (an adapter on some layers only, or of other shapes, cannot be continued): ", e.what()));
    }
  }
  in.memory = preflight_memory(config, in.layout, o, in.loss_chunk, shape);
  // hf/ of the checkpoints: as asked, else as the weights came, else the masters' dtype.
  in.save_dtype = o.output.save_dtype;
  if (!in.save_dtype)
    in.save_dtype = in.resolved.weights ? in.resolved.weights->dominant_dtype() : master_dtype_of(o.inputs.dtype);
  open_data(o, mesh, in);
  if (resumes_from_nothing(o.output.out, o.output.resume)) {
    in.resume_note = "--resume " + o.output.resume +
                     " holds no checkpoint yet (the job stopped before its first "
                     "save): this run starts from step 1";
  } else if (!o.output.resume.empty()) {
    // Every file verified before any is parsed; read before the model is built, so that
    // the ranks can agree on what they load before the first collective.
    in.checkpoint = load_checkpoint(o.output.resume);
  }
  return in;
}

}  // namespace mmsp::train
