// The training loop; see trainer.h. Order of a step: data (pure, same on every rank)
// → plan → pixels this rank encodes → forward/backward on the shard → bucketed
// gradient all-reduce over the world → clip → AdamW → metrics → checkpoint.
#include "mmsp/train/trainer.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/core/phase_timer.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/model/checkpoint_naming.h"
#include "mmsp/model/families/internvl/internvl_model.h"
#include "mmsp/model/llava.h"
#include "mmsp/model/parameter_init.h"
#include "mmsp/model/qwen_vl.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/builtin_models.h"
#include "mmsp/train/checkpoint.h"
#include "mmsp/train/chunked_loss.h"
#include "mmsp/train/grad_clip.h"
#include "mmsp/train/grad_sync.h"
#include "mmsp/train/jsonl_dataset.h"
#include "mmsp/train/lr_schedule.h"
#include "mmsp/train/master_weights.h"
#include "mmsp/train/memory_estimate.h"
#include "mmsp/train/memory_counter.h"
#include "mmsp/train/optimizer.h"
#include "mmsp/train/run_checks.h"
#include "mmsp/train/shapes_dataset.h"
#include "mmsp/train/step_fingerprint.h"
#include "mmsp/train/step_packer.h"
#include "mmsp/train/step_pixels.h"
#include "mmsp/train/train_state.h"
#include "mmsp/train/weight_update.h"

namespace mmsp::train {
namespace {

using Clock = std::chrono::steady_clock;

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float64" || name == "fp64") return at::kDouble;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  MMSP_CHECK(false, "--dtype '", name, "' must be float32, float64 or bfloat16");
  return at::kFloat;
}

// The optimizer side of a compute dtype: bf16 trains with fp32 masters.
at::ScalarType master_dtype_of(at::ScalarType compute) { return compute == at::kBFloat16 ? at::kFloat : compute; }

std::optional<at::ScalarType> parse_save_dtype(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name == "float16" || name == "fp16") return at::kHalf;
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float64" || name == "fp64") return at::kDouble;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  MMSP_CHECK(false, "--save-dtype '", name, "' must be bfloat16, float16, float32 or float64");
  return std::nullopt;
}

// The VLM of the config's family behind one forward.
class Vlm {
 public:
  explicit Vlm(const model::ModelConfig& config) {
    if (config.family == plan::ModelFamily::llava)
      llava_ = std::make_shared<model::LlavaModel>(config);
    else if (config.family == plan::ModelFamily::internvl)
      internvl_ = std::make_shared<model::InternVLModel>(config);
    else
      qwen_ = std::make_shared<model::QwenVLModel>(config);
  }
  torch::nn::Module& module() {
    if (qwen_) return *qwen_;
    if (llava_) return *llava_;
    return *internvl_;
  }
  void set_activation_checkpointing(model::ActivationCheckpointing mode) {
    if (qwen_) qwen_->set_activation_checkpointing(mode);
    if (llava_) llava_->set_activation_checkpointing(mode);
    if (internvl_) internvl_->set_activation_checkpointing(mode);
  }
  model::QwenVLModel::StepOutput forward(const plan::Batch& batch, const plan::StepPlan& plan,
                                         const model::PixelInputs& pixels, const model::StepGroups& groups,
                                         model::VisionMode mode, const attention::AttentionOptions& attn) const {
    if (qwen_) return qwen_->forward(batch, plan, pixels, groups, mode, attn);
    if (llava_) return llava_->forward(batch, plan, pixels, groups, mode, attn);
    return internvl_->forward(batch, plan, pixels, groups, mode, attn);
  }

 private:
  std::shared_ptr<model::QwenVLModel> qwen_;
  std::shared_ptr<model::LlavaModel> llava_;
  std::shared_ptr<model::InternVLModel> internvl_;
};

NamedParams named_parameters(torch::nn::Module& module) {
  NamedParams out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

std::unique_ptr<Vlm> build_vlm(const model::ModelConfig& config, model::ParameterInit mode) {
  model::ParameterInitScope init(mode);
  return std::make_unique<Vlm>(config);
}

// Every parameter's name and shape, from a skeleton of meta tensors: nothing allocated.
model::ExpectedShapes parameter_shapes(const model::ModelConfig& config) {
  const std::unique_ptr<Vlm> skeleton = build_vlm(config, model::ParameterInit::meta);
  model::ExpectedShapes shapes;
  for (const auto& item : skeleton->module().named_parameters())
    shapes.emplace_back(item.key(), item.value().sizes().vec());
  return shapes;
}

// This rank's memory for the run; refused (naming every part) when over the limit.
MemoryEstimate preflight_memory(const model::ModelConfig& config, const model::ExpectedShapes& shapes,
                                const TrainOptions& o, at::ScalarType dtype, int world) {
  MemoryEstimateInputs in;
  in.compute_dtype = dtype;
  in.master_dtype = master_dtype_of(dtype);
  in.tokens_per_rank = o.tokens_per_rank;
  in.attention_block = o.attention_block;
  in.loss_chunk = o.loss_chunk > 0 ? o.loss_chunk : default_loss_chunk(config.text.vocab_size);
  in.checkpointing = o.checkpoint_activations;
  if (parse_shard_level(o.shard) == ShardLevel::optimizer) in.shard_world = world;
  const MemoryEstimate memory = estimate_memory(config, shapes, in);
  check_memory_fits(memory, o.memory_limit_bytes, o.memory_limit_source);
  return memory;
}

std::unique_ptr<Dataset> make_dataset(const TrainOptions& o, const model::ModelConfig& config) {
  if (o.data == "shapes") {
    ShapesOptions shapes;
    shapes.seed = o.seed;
    shapes.samples = o.shapes_samples;
    shapes.blank_images = o.blank_images;
    return std::make_unique<ShapesDataset>(shapes, config);
  }
  MMSP_CHECK(!o.blank_images, "--blank-images applies to the built-in shapes dataset only, not '", o.data, "'");
  return std::make_unique<JsonlDataset>(o.data, config, o.max_image_pixels);
}

// Items of the batch this rank's encoder reads (the others' pixels are never decoded).
std::function<bool(plan::VisionKind, int64_t)> pixels_needed(const plan::StepPlan& plan, model::VisionMode mode) {
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  std::vector<std::pair<plan::VisionKind, int64_t>> wanted;
  if (mode == model::VisionMode::replicate) {
    for (const auto& item : items) wanted.emplace_back(item.kind, item.batch_index);
  } else {
    for (int64_t i : plan.mine.routes.encoder_items) wanted.emplace_back(items.at(i).kind, items.at(i).batch_index);
  }
  std::sort(wanted.begin(), wanted.end());
  return [wanted = std::move(wanted)](plan::VisionKind kind, int64_t item) {
    return std::binary_search(wanted.begin(), wanted.end(), std::make_pair(kind, item));
  };
}

// The loss summed over the world, and each figure of every rank ([figure][rank]).
struct Reduced {
  double loss = 0;
  std::vector<std::vector<double>> per_rank;
  double max(size_t figure) const { return *std::max_element(per_rank[figure].begin(), per_rank[figure].end()); }
};
Reduced reduce_metrics(double local_loss, const std::vector<double>& mine, const dist::Mesh& mesh) {
  const int64_t n = static_cast<int64_t>(mine.size()), world = mesh.world_size();
  at::Tensor buffer = at::zeros({1 + n * world}, at::kDouble);
  buffer[0] = local_loss;
  for (int64_t i = 0; i < n; ++i) buffer[1 + i * world + mesh.rank()] = mine[i];
  dist::all_reduce_(buffer, *mesh.world());
  Reduced r;
  r.loss = buffer[0].item<double>();
  const double* p = buffer.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) r.per_rank.emplace_back(p + 1 + i * world, p + 1 + (i + 1) * world);
  return r;
}

}  // namespace

void check_train_options(const TrainOptions& o, const plan::Mesh& mesh) {
  check_train_limits(o);  // upper bounds first: nothing below may overflow
  parse_dtype(o.dtype);
  parse_save_dtype(o.save_dtype);
  parse_shard_level(o.shard);
  MMSP_CHECK(o.save_shard_bytes > 0, "--save-shard-size ", o.save_shard_bytes, " must be positive");
  MMSP_CHECK(o.memory_limit_bytes >= 0, "--memory-limit ", o.memory_limit_bytes, " must be ≥ 0 (0: no check)");
  MMSP_CHECK(o.steps > 0, "--steps ", o.steps, " must be positive");
  MMSP_CHECK(o.tokens_per_rank > 0, "--tokens-per-rank ", o.tokens_per_rank, " must be positive");
  MMSP_CHECK(o.data_rows >= 0, "--data-rows ", o.data_rows, " must be ≥ 0");
  const int rows = o.data_rows > 0 ? o.data_rows : mesh.dp;
  MMSP_CHECK(o.tokens_per_rank * mesh.world() % rows == 0, "--tokens-per-rank ", o.tokens_per_rank, " × world ",
             mesh.world(), " must divide into --data-rows ", rows, " equal rows");
  MMSP_CHECK(o.shapes_samples > 0, "--shapes-samples ", o.shapes_samples, " must be positive");
  MMSP_CHECK(o.attention_block > 0, "--attention-block ", o.attention_block, " must be positive");
  MMSP_CHECK(o.loss_chunk >= 0, "--loss-chunk ", o.loss_chunk,
             " must be ≥ 0 (tokens per chunk of the LM head and loss; 0: the default, ≤ 256 MiB of logits)");
  MMSP_CHECK(o.lr > 0 && o.min_lr >= 0 && o.min_lr <= o.lr, "--lr ", o.lr, " and --min-lr ", o.min_lr,
             " must satisfy 0 ≤ min-lr ≤ lr, lr > 0");
  MMSP_CHECK(o.warmup_steps >= 0, "--warmup ", o.warmup_steps, " must be ≥ 0");
  MMSP_CHECK(o.checkpoint_every >= 0, "--checkpoint-every ", o.checkpoint_every, " must be ≥ 0");
  MMSP_CHECK(o.checkpoint_every == 0 || !o.out_dir.empty(), "--checkpoint-every needs --out DIR");
  MMSP_CHECK(o.keep_checkpoints >= 0, "--keep ", o.keep_checkpoints, " must be ≥ 0");
  MMSP_CHECK(o.stop_after >= 0, "--stop-after ", o.stop_after, " must be ≥ 0");
  MMSP_CHECK(o.weight_decay >= 0, "--weight-decay ", o.weight_decay, " must be ≥ 0");
}

TrainReport train(const TrainOptions& o, const dist::Mesh& mesh, std::ostream& log,
                  dist::RankActivity* activity) {
  dist::RankActivity no_heartbeat;
  dist::RankActivity& doing = activity ? *activity : no_heartbeat;
  // Everything that can be wrong with the options, the model or the data fails here,
  // on every rank alike, before the first collective.
  check_train_options(o, mesh.shape());
  const at::ScalarType dtype = parse_dtype(o.dtype);
  const at::ScalarType master_dtype = master_dtype_of(dtype);
  const ResolvedModel resolved = resolve_model(o.model);
  const model::ModelConfig& config = resolved.config;
  const plan::Mesh& shape = mesh.shape();
  MMSP_CHECK(config.text.num_attention_heads % shape.ulysses == 0, o.model, ": ",
             config.text.num_attention_heads, " attention heads cannot be split over ulysses ", shape.ulysses,
             " (the degree must divide the head count)");
  // The weights' names and shapes, the checkpoint's mapping and the memory this run
  // needs are all checked on a skeleton, before a parameter is allocated.
  const model::ExpectedShapes shapes = parameter_shapes(config);
  const model::CheckpointNaming naming = model::checkpoint_naming(config);
  if (resolved.weights) model::match_hf_tensors(*resolved.weights, shapes, naming);
  const MemoryEstimate memory = preflight_memory(config, shapes, o, dtype, mesh.world_size());
  // hf/ of the checkpoints: as asked, else as the weights came, else the masters' dtype.
  std::optional<at::ScalarType> save_dtype = parse_save_dtype(o.save_dtype);
  if (!save_dtype) save_dtype = resolved.weights ? resolved.weights->dominant_dtype() : master_dtype;
  std::unique_ptr<Dataset> data = make_dataset(o, config);
  // Rows of the packer = the budget split data_rows ways (see TrainOptions::data_rows).
  const int rows = o.data_rows > 0 ? o.data_rows : mesh.shape().dp;
  PackerOptions packing;
  packing.tokens_per_rank = o.tokens_per_rank * mesh.world_size() / rows;
  packing.dp = rows;
  packing.context = 1;
  packing.seed = o.seed;
  packing.shuffle = o.shuffle;
  StepPacker packer(*data, packing);
  if (const auto* jsonl = dynamic_cast<const JsonlDataset*>(data.get())) jsonl->check_lengths(packer.row_limit());
  const bool rank0 = mesh.rank() == 0;

  MemoryCounter::install();
  at::manual_seed(static_cast<int64_t>(o.seed));  // identical replicas on every rank
  // Weights about to be loaded (a model directory, a checkpoint) need no random draw.
  const bool loading = resolved.weights || !o.resume.empty();
  const std::unique_ptr<Vlm> built =
      build_vlm(config, loading ? model::ParameterInit::uninitialised : model::ParameterInit::random);
  Vlm& vlm = *built;
  vlm.module().to(dtype);
  vlm.set_activation_checkpointing(o.checkpoint_activations);
  const int64_t loss_chunk = o.loss_chunk > 0 ? o.loss_chunk : default_loss_chunk(config.text.vocab_size);
  AdamWOptions adamw;
  adamw.lr = o.lr;
  adamw.beta1 = o.beta1;
  adamw.beta2 = o.beta2;
  adamw.eps = o.eps;
  adamw.weight_decay = o.weight_decay;
  const std::unique_ptr<WeightUpdate> update =
      make_weight_update(parse_shard_level(o.shard), named_parameters(vlm.module()), master_dtype, adamw, mesh);
  if (resolved.weights && o.resume.empty())  // a resume reads the checkpoint's weights instead
    update->load_weights(*resolved.weights, naming);
  // A warm-up longer than the run is the run (short test runs keep the default).
  const LrSchedule schedule{o.lr, o.min_lr, std::min(o.warmup_steps, o.steps), o.steps};
  schedule.validate();

  DataPosition position;
  int64_t done = 0;  // steps completed
  if (!o.resume.empty()) {
    const Checkpoint ckpt = load_checkpoint(o.resume);
    if (rank0)
      for (const std::string& note : ckpt.notes) log << "note: " << note << std::endl;
    MMSP_CHECK(same_model_config(ckpt.config_json, resolved.config_json),
               "--resume ", o.resume, " holds a checkpoint of another model than --model ", o.model);
    update->restore(ckpt);
    done = ckpt.step;
    position.epoch = ckpt.state.at("data").at("epoch").get<int64_t>();
    position.offset = ckpt.state.at("data").at("offset").get<int64_t>();
    // The batches and numerics continue as before only with the same flags (any mesh).
    check_resume_flags(ckpt.state.at("run"), run_flags(o, mesh.shape(), rows), o.allow_changed_flags, o.resume,
                       rank0 ? &log : nullptr);
    restore_cpu_rng(ckpt.state.at("cpu_rng").get<std::string>(), ckpt.path);
    if (rank0) log << "resumed from " << o.resume << " after step " << done << std::endl;
  }
  MMSP_CHECK(done < o.steps, "nothing to do: the checkpoint is at step ", done, " and --steps is ", o.steps);

  std::unique_ptr<MetricsWriter> metrics;
  if (rank0 && !o.out_dir.empty()) {
    std::filesystem::create_directories(o.out_dir);
    metrics = std::make_unique<MetricsWriter>(o.out_dir + "/metrics.jsonl");
  }
  if (rank0 && o.print_steps) {
    log << "mmsp train: " << resolved.source << " (" << config.model_type
        << (resolved.weights ? ", weights loaded" : ", random weights") << "), " << data->describe()
        << ", mesh " << mesh.shape().str() << ", vision " << model::to_string(o.vision) << ", " << o.dtype
        << (update->describe().empty() ? "" : ", " + update->describe()) << ", " << update->weights().size()
        << " tensors" << std::endl;
    log << memory.table() << std::endl;
  }

  attention::AttentionOptions attn;
  attn.block_q = o.attention_block;
  attn.block_k = o.attention_block;
  const model::StepGroups groups{mesh.context(), mesh.ring(), mesh.ulysses()};
  plan::PlanOptions plan_options;
  plan_options.mesh = mesh.shape();
  plan_options.layout = o.layout;

  const std::string fingerprint_prefix = mesh.store() ? fingerprint_key_prefix(*mesh.store(), mesh.rank()) : "";
  TrainReport report;
  report.first_step = done + 1;
  const int64_t last_step = o.stop_after > 0 ? std::min(o.stop_after, o.steps) : o.steps;
  for (int64_t step = done + 1; step <= last_step; ++step) {
    const auto t0 = Clock::now();
    phase_reset();
    MemoryCounter::reset_peak();
    const dist::CommSnapshot comm0 = mesh.stats().snapshot();

    doing.set(step, "data");
    std::vector<int64_t> samples = packer.next_step(position);
    if (o.test.skew_batch_rank == mesh.rank() && o.test.skew_batch_step == step && samples.size() > 1)
      samples.pop_back();
    const plan::Batch batch = make_batch(*data, samples);
    doing.set_phase("plan");
    const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, plan_options, mesh.rank());
    // Every rank must be about to run the same step before the first collective.
    doing.set_phase("step agreement");
    if (mesh.store())
      agree_on_step(*mesh.store(), fingerprint_prefix, step, step_fingerprint(samples, batch, plan), mesh.rank(),
                    mesh.world_size(), mesh.world()->timeout());
    doing.set_phase("pixels");
    const model::PixelInputs pixels = load_pixels(*data, samples, batch, config, pixels_needed(plan, o.vision), dtype);

    const double lr = schedule.at(step - 1);
    update->set_lr(lr);
    update->zero_grad();
    doing.set_phase("forward");
    if (o.test.sleep_rank == mesh.rank() && o.test.sleep_step == step)
      std::this_thread::sleep_for(std::chrono::duration<double>(o.test.sleep_seconds));
    auto out = vlm.forward(batch, plan, pixels, groups, o.vision, attn);
    at::Tensor loss = chunked_lm_loss(out.hidden, out.head_weight, out.labels, out.label_count, loss_chunk);
    doing.set_phase("backward");
    loss.backward();
    const double grad_norm = update->step(o.clip_norm, doing);
    doing.set_phase("metrics");
    const double local_loss = loss.detach().to(at::kDouble).item<double>();

    const int64_t comm_bytes = (mesh.stats().snapshot() - comm0).total_bytes();
    const PhaseTimes phases = phase_times();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    // Every rank's figures, to report the slowest rank's split and the largest memory / bytes.
    const Reduced r = reduce_metrics(local_loss,
                                     {seconds, phases.vision_s, phases.attention_s, phases.communication_s,
                                      static_cast<double>(MemoryCounter::peak_bytes()),
                                      static_cast<double>(comm_bytes)},
                                     mesh);
    StepMetrics m;
    m.step = step;
    m.loss = r.loss;
    m.lr = lr;
    m.grad_norm = grad_norm;
    for (const auto& s : batch.sequences) m.tokens += static_cast<int64_t>(s.input_ids.size());
    m.label_tokens = plan.label_count;
    // The slowest rank sets the pace: its time and its split (a partition of it);
    // memory and bytes are each the largest of any rank.
    const auto& times = r.per_rank[0];
    const size_t slowest = std::max_element(times.begin(), times.end()) - times.begin();
    m.seconds = times[slowest];
    m.vision_s = r.per_rank[1][slowest];
    m.attention_s = r.per_rank[2][slowest];
    m.communication_s = r.per_rank[3][slowest];
    m.other_s = std::max(0.0, m.seconds - m.vision_s - m.attention_s - m.communication_s);
    m.peak_bytes = static_cast<int64_t>(r.max(4));
    m.comm_bytes = static_cast<int64_t>(r.max(5));
    report.steps.push_back(m);
    if (rank0 && o.print_steps) log << format_step_line(m) << std::endl;
    if (metrics) metrics->write(m);

    const bool last = step == last_step;
    if (!o.out_dir.empty() && (last || (o.checkpoint_every > 0 && step % o.checkpoint_every == 0))) {
      nlohmann::json state;
      state["step"] = step;
      state["cpu_rng"] = capture_cpu_rng();
      state["data"] = {{"epoch", position.epoch}, {"offset", position.offset}};
      state["run"] = run_flags(o, mesh.shape(), rows);
      CheckpointOptions ckpt;
      ckpt.keep_last = o.keep_checkpoints;
      ckpt.save_dtype = save_dtype;
      ckpt.max_shard_bytes = static_cast<uint64_t>(o.save_shard_bytes);
      if (o.test.crash_checkpoint_step == step) ckpt.crash_after_bytes = o.test.crash_checkpoint_after_bytes;
      doing.set_phase("checkpoint");
      update->save(o.out_dir, step, state, resolved.config_json, ckpt, mesh, log);
    }
  }
  if (rank0 && !report.steps.empty()) log << summary_table(report.steps);
  for (auto& [name, p] : update->weights()) report.parameters.emplace_back(name, p.detach().clone());
  return report;
}

}  // namespace mmsp::train
