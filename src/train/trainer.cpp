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
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <ostream>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/core/phase_timer.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/model/checkpoint_naming.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/model/family.h"
#include "mmsp/parallel/parallelize.h"
#include "mmsp/model/vlm.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/builtin_models.h"
#include "mmsp/train/checkpoint/checkpoint.h"
#include "mmsp/train/checkpoint/run_directory.h"
#include "mmsp/train/loaded_inputs.h"
#include "mmsp/train/loss/chunked_loss.h"
#include "mmsp/train/optim/grad_clip.h"
#include "mmsp/parallel/grad_sync.h"
#include "mmsp/train/data/jsonl_dataset.h"
#include "mmsp/train/optim/lr_schedule.h"
#include "mmsp/train/optim/master_weights.h"
#include "mmsp/train/memory/memory_estimate.h"
#include "mmsp/train/memory/vision_load.h"
#include "mmsp/train/memory/memory_counter.h"
#include "mmsp/train/optim/optimizer.h"
#include "mmsp/train/run_checks.h"
#include "mmsp/train/data/shapes_dataset.h"
#include "mmsp/train/step_fingerprint.h"
#include "mmsp/train/data/step_packer.h"
#include "mmsp/train/data/step_pixels.h"
#include "mmsp/train/step_watch.h"
#include "mmsp/train/checkpoint/train_state.h"
#include "mmsp/train/weight_update.h"

namespace mmsp::train {

PrefetchPixels parse_prefetch_pixels(const std::string& name) {
  if (name == "off") return PrefetchPixels::off;
  if (name == "on") return PrefetchPixels::on;
  if (name == "auto") return PrefetchPixels::automatic;
  MMSP_FAIL("--prefetch-pixels '", name, "' must be off, on or auto");
}

std::string to_string(PrefetchPixels mode) {
  return mode == PrefetchPixels::off ? "off" : mode == PrefetchPixels::on ? "on" : "auto";
}

namespace {


at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float64" || name == "fp64") return at::kDouble;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  MMSP_FAIL("--dtype '", name, "' must be float32, float64 or bfloat16");
}

// The optimizer side of a compute dtype: bf16 trains with fp32 masters.
at::ScalarType master_dtype_of(at::ScalarType compute) { return compute == at::kBFloat16 ? at::kFloat : compute; }

std::optional<at::ScalarType> parse_save_dtype(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name == "float16" || name == "fp16") return at::kHalf;
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float64" || name == "fp64") return at::kDouble;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  MMSP_FAIL("--save-dtype '", name, "' must be bfloat16, float16, float32 or float64");
}

// The config's family from the registry, parameters drawn as `mode` says, made in `dtype`.
std::shared_ptr<model::Vlm> build_vlm(const model::ModelConfig& config, model::ParameterInit mode,
                                      at::ScalarType dtype = at::kFloat) {
  model::ParameterInitScope init(mode, dtype);
  return model::build_vlm(config);
}

// Every parameter's name and shape and its hooked unit, from a skeleton of meta
// tensors: nothing allocated.
ParameterLayout layout_of(const model::ModelConfig& config) {
  return parameter_layout(*build_vlm(config, model::ParameterInit::meta));
}

// `local_length`: a step's padded slots a rank holds, when known (0: --tokens-per-rank).
MemoryEstimate estimate_for(const model::ModelConfig& config, const ParameterLayout& layout,
                            const TrainOptions& o, const ParsedTrainOptions& parsed, int64_t loss_chunk,
                            const plan::Mesh& mesh, int64_t local_length = 0) {
  MemoryEstimateInputs in;
  in.compute_dtype = parsed.dtype;
  in.master_dtype = master_dtype_of(parsed.dtype);
  in.tokens_per_rank = o.tokens_per_rank;
  in.local_length = local_length;
  in.attention_block = o.attention_block;
  in.loss_chunk = loss_chunk;
  in.checkpointing = o.checkpoint_activations;
  in.offload_activations = o.offload_activations && o.device.is_cuda();  // on the CPU the host is the device
  in.mlp_tile = model::mlp_tile_tokens(o.tiled_mlp, std::max(o.tokens_per_rank, local_length), config.text.hidden_size);
  in.shard_level = parsed.shard_level;
  if (in.shard_level != parallel::ShardLevel::none) in.shard_world = mesh.world();
  in.ring = mesh.ring;
  in.ulysses = mesh.ulysses;
  return estimate_memory(config, layout, in);
}

// This rank's memory for the run; refused (naming every part) when over the limit.
MemoryEstimate preflight_memory(const model::ModelConfig& config, const ParameterLayout& layout,
                                const TrainOptions& o, const ParsedTrainOptions& parsed, int64_t loss_chunk,
                                const plan::Mesh& mesh) {
  const MemoryEstimate memory = estimate_for(config, layout, o, parsed, loss_chunk, mesh);
  check_memory_fits(memory, o.memory_limit_bytes, o.memory_limit_source);
  return memory;
}

// `row_tokens`: the most tokens one row of a step holds; a data line too long to hold a
// sample that fits is refused before it is parsed (JsonlDataset's max_line_bytes).
std::unique_ptr<Dataset> make_dataset(const TrainOptions& o, const model::ModelConfig& config, int64_t row_tokens) {
  if (o.data == "shapes") {
    ShapesOptions shapes;
    shapes.seed = o.seed;
    shapes.samples = o.shapes_samples;
    shapes.blank_images = o.blank_images;
    return std::make_unique<ShapesDataset>(shapes, config);
  }
  MMSP_CHECK(!o.blank_images, "--blank-images applies to the built-in shapes dataset only, not '", o.data, "'");
  return std::make_unique<JsonlDataset>(o.data, config, o.max_image_pixels,
                                        JsonlDataset::line_bytes_for(row_tokens));
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

ParsedTrainOptions check_train_options(const TrainOptions& o, const plan::Mesh& mesh) {
  check_train_limits(o);  // upper bounds first: nothing below may overflow
  ParsedTrainOptions parsed;
  parsed.dtype = parse_dtype(o.dtype);
  parsed.save_dtype = parse_save_dtype(o.save_dtype);
  parsed.shard_level = parallel::parse_shard_level(o.shard);
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
  attention::parse_attention_kernel(o.attention_kernel);  // names a bad --attention-kernel before anything runs
  MMSP_CHECK(!o.offload_activations || o.checkpoint_activations != model::ActivationCheckpointing::none,
             "--offload-activations keeps the inputs of recomputed layers in host memory: it needs "
             "--checkpoint-activations decoder or all, not none");
  MMSP_CHECK(o.tiled_mlp >= model::kAutoMlpTile, "--tiled-mlp ", o.tiled_mlp,
             " must be off (0), auto or a number of tokens per tile >= 1");
  MMSP_CHECK(o.loss_chunk >= 0, "--loss-chunk ", o.loss_chunk,
             " must be ≥ 0 (tokens per chunk of the LM head and loss; 0: the default, ≤ 256 MiB of logits)");
  MMSP_CHECK(o.lr > 0 && o.min_lr >= 0 && o.min_lr <= o.lr, "--lr ", o.lr, " and --min-lr ", o.min_lr,
             " must satisfy 0 ≤ min-lr ≤ lr, lr > 0");
  MMSP_CHECK(o.warmup >= 0, "--warmup ", o.warmup, " must be ≥ 0");
  MMSP_CHECK(o.checkpoint_every >= 0, "--checkpoint-every ", o.checkpoint_every, " must be ≥ 0");
  MMSP_CHECK(o.checkpoint_every == 0 || !o.out.empty(), "--checkpoint-every needs --out DIR");
  MMSP_CHECK(o.keep >= 0, "--keep ", o.keep, " must be ≥ 0");
  MMSP_CHECK(o.stop_after >= 0, "--stop-after ", o.stop_after, " must be ≥ 0");
  MMSP_CHECK(o.weight_decay >= 0, "--weight-decay ", o.weight_decay, " must be ≥ 0");
  // AdamW moves each weight by about lr per step: above 1 a step outweighs the weights
  // themselves (1e308 overflowed only after step 1). Decoupled decay scales the weights
  // by 1 − lr × weight_decay: above 1 it flips their sign.
  MMSP_CHECK(o.lr <= kMaxLr, "--lr ", o.lr, " is beyond ", kMaxLr,
             ": AdamW moves every weight by about lr per step (fine-tuning uses 1e-6 to 1e-3)");
  MMSP_CHECK(o.lr * o.weight_decay <= 1, "--lr ", o.lr, " × --weight-decay ", o.weight_decay,
             " must be ≤ 1: decoupled weight decay multiplies the weights by 1 − lr × weight_decay");
  MMSP_CHECK(o.clip >= 0, "--clip ", o.clip, " must be ≥ 0 (the global gradient norm to clip to; 0: off)");
  MMSP_CHECK(o.save_gradients.empty() || parsed.shard_level == parallel::ShardLevel::none, "--save-gradients needs --shard none (",
             "with --shard ", o.shard, " no rank holds the whole gradient)");
  if (!o.save_gradients.empty()) {
    std::error_code ec;
    MMSP_CHECK(!std::filesystem::exists(o.save_gradients, ec) || std::filesystem::is_empty(o.save_gradients, ec),
               "--save-gradients ", o.save_gradients, " exists and is not empty (nothing in it is overwritten)");
  }
  return parsed;
}

namespace {

// What a run is made of, checked before anything is allocated: the model, its dtypes,
// the memory it needs, the data and the packer of the steps.
struct RunInputs {
  ResolvedModel resolved;
  at::ScalarType dtype = at::kFloat;
  std::optional<at::ScalarType> save_dtype;  // hf/ of the checkpoints
  parallel::ShardLevel shard_level = parallel::ShardLevel::none;
  int64_t loss_chunk = 0;  // tokens per chunk of the LM head and loss (the default resolved)
  hf::CheckpointNaming naming;
  ParsedTrainOptions parsed;
  ParameterLayout layout;  // every parameter's shape and unit, from the skeleton (each step's estimate reads them)
  MemoryEstimate memory;
  std::unique_ptr<Dataset> data;
  int rows = 1;  // rows of the packer (TrainOptions::data_rows)
  std::unique_ptr<StepPacker> packer;
  // --resume's checkpoint, verified (none for a fresh run, and for a requeued job's
  // --resume of its own --out that holds no checkpoint yet: it starts afresh).
  std::optional<Checkpoint> checkpoint;
  std::string resume_note;  // said by rank 0 when --resume found nothing to resume
};

// Everything that can be wrong with the options, the model or the data fails here, on
// every rank alike, before the first collective.
RunInputs check_run(const TrainOptions& o, const dist::Mesh& mesh) {
  const ParsedTrainOptions parsed = check_train_options(o, mesh.shape());
  RunInputs in;
  in.dtype = parsed.dtype;
  in.shard_level = parsed.shard_level;
  const at::ScalarType master_dtype = master_dtype_of(in.dtype);
  in.resolved = resolve_model(o.model);
  const model::ModelConfig& config = in.resolved.config;
  in.loss_chunk = o.loss_chunk > 0 ? o.loss_chunk : default_loss_chunk(config.text.vocab_size);
  const plan::Mesh& shape = mesh.shape();
  MMSP_CHECK(config.text.num_attention_heads % shape.ulysses == 0, o.model, ": ",
             config.text.num_attention_heads, " attention heads cannot be split over ulysses ", shape.ulysses,
             " (the degree must divide the head count)");
  // The weights' names and shapes, the checkpoint's mapping and the memory this run
  // needs are all checked on a skeleton, before a parameter is allocated.
  in.parsed = parsed;
  in.layout = layout_of(config);
  in.naming = model::checkpoint_naming(config);
  if (in.resolved.weights) hf::match_hf_tensors(*in.resolved.weights, in.layout.shapes, in.naming);
  in.memory = preflight_memory(config, in.layout, o, parsed, in.loss_chunk, shape);
  // hf/ of the checkpoints: as asked, else as the weights came, else the masters' dtype.
  in.save_dtype = parsed.save_dtype;
  if (!in.save_dtype) in.save_dtype = in.resolved.weights ? in.resolved.weights->dominant_dtype() : master_dtype;
  // Rows of the packer = the budget split data_rows ways (see TrainOptions::data_rows).
  in.rows = o.data_rows > 0 ? o.data_rows : shape.dp;
  in.data = make_dataset(o, config, o.tokens_per_rank * mesh.world_size() / in.rows);
  PackerOptions packing;
  packing.tokens_per_row = o.tokens_per_rank * mesh.world_size() / in.rows;
  packing.rows = in.rows;
  packing.seed = o.seed;
  packing.shuffle = o.shuffle;
  in.packer = std::make_unique<StepPacker>(*in.data, packing);
  if (const auto* jsonl = dynamic_cast<const JsonlDataset*>(in.data.get()))
    jsonl->check_lengths(in.packer->row_limit());
  if (resumes_from_nothing(o.out, o.resume)) {
    in.resume_note = "--resume " + o.resume + " holds no checkpoint yet (the job stopped before its first save): "
                     "this run starts from step 1";
  } else if (!o.resume.empty()) {
    // Every file verified before any is parsed; read before the model is built, so that
    // the ranks can agree on what they load before the first collective.
    in.checkpoint = load_checkpoint(o.resume);
  }
  return in;
}

attention::AttentionOptions attention_options_for(const TrainOptions& o) {
  attention::AttentionOptions blocks;
  blocks.block_q = o.attention_block;
  blocks.block_k = o.attention_block;
  blocks.kernel = attention::parse_attention_kernel(o.attention_kernel);
  return blocks;
}

// The model on this rank, identical on every rank, spread over the mesh
// (parallel::parallelize), and its weight update (AdamW over the masters, replicated or
// over ZeRO's shards), with the model directory's weights when given.
struct Trainable {
  std::shared_ptr<model::Vlm> vlm;
  parallel::ModelParallelism parallelism;
  std::unique_ptr<WeightUpdate> update;
};

Trainable build_trainable(const TrainOptions& o, const RunInputs& in, const dist::Mesh& mesh) {
  at::manual_seed(static_cast<int64_t>(o.seed));  // identical replicas on every rank
  // Weights about to be loaded (a model directory, a checkpoint) need no random draw.
  const bool loading = in.resolved.weights || in.checkpoint.has_value();
  Trainable t;
  t.vlm = build_vlm(in.resolved.config, loading ? model::ParameterInit::uninitialised : model::ParameterInit::random,
                    in.dtype);
  // The buffers (rotary tables) into the dtype, everything onto the rank's device; the
  // masters and optimizer state below follow the parameters there.
  t.vlm->to(o.device, in.dtype);
  parallel::ParallelizeOptions spread;
  spread.checkpoint_activations = o.checkpoint_activations;
  spread.offload_activations = o.offload_activations;
  spread.mlp_tile = o.tiled_mlp;
  spread.shard = in.shard_level;
  spread.master_dtype = master_dtype_of(in.dtype);
  spread.groups = {mesh.context(), mesh.ring(), mesh.ulysses()};
  spread.vision = o.vision;
  spread.attention = attention_options_for(o);
  t.parallelism = parallel::parallelize(*t.vlm, spread, mesh.world());
  AdamWOptions adamw;
  adamw.lr = o.lr;
  adamw.beta1 = o.beta1;
  adamw.beta2 = o.beta2;
  adamw.eps = o.eps;
  adamw.weight_decay = o.weight_decay;
  t.update = make_weight_update(model::named_parameters(*t.vlm), master_dtype_of(in.dtype), adamw, mesh,
                                t.parallelism.zero);
  if (in.resolved.weights && !in.checkpoint)  // a resume reads the checkpoint's weights instead
    t.update->load_weights(*in.resolved.weights, in.naming);
  return t;
}

// Where the run continues: after the checkpoint's step and data position (on any mesh,
// with the same flags), or at the start.
struct ResumePoint {
  int64_t done = 0;  // steps completed
  DataPosition position;
};

ResumePoint resume_run(const TrainOptions& o, const RunInputs& in, WeightUpdate& update, const dist::Mesh& mesh,
                       std::ostream& log) {
  ResumePoint point;
  const bool rank0 = mesh.rank() == 0;
  if (rank0 && !in.resume_note.empty()) log << "note: " << in.resume_note << std::endl;
  if (!in.checkpoint) return point;
  const Checkpoint& ckpt = *in.checkpoint;
  if (rank0)
    for (const std::string& note : ckpt.notes) log << "note: " << note << std::endl;
  MMSP_CHECK(same_model_config(ckpt.config_json, in.resolved.config_json),
             "--resume ", o.resume, " holds a checkpoint of another model than --model ", o.model);
  update.restore(ckpt);
  point.done = ckpt.step;
  point.position.epoch = ckpt.state.at("data").at("epoch").get<int64_t>();
  point.position.offset = ckpt.state.at("data").at("offset").get<int64_t>();
  // The batches and numerics continue as before only with the same flags (any mesh).
  check_resume_flags(ckpt.state.at("run"), run_flags(o, mesh.shape(), in.rows), o.allow_changed_flags, o.resume,
                     rank0 ? &log : nullptr);
  restore_cpu_rng(ckpt.state.at("cpu_rng").get<std::string>(), ckpt.path);
  if (rank0) log << "resumed from " << o.resume << " after step " << point.done << std::endl;
  return point;
}

void print_run_header(const TrainOptions& o, const RunInputs& in, const WeightUpdate& update,
                      const dist::Mesh& mesh, std::ostream& log) {
  log << "mmsp train: " << in.resolved.source << " (" << in.resolved.config.model_type
      << (in.resolved.weights ? ", weights loaded" : ", random weights") << "), " << in.data->describe()
      << ", mesh " << mesh.shape().str() << ", vision " << model::to_string(o.vision) << ", " << o.dtype
      << (update.describe().empty() ? "" : ", " + update.describe()) << ", " << update.weights().size()
      << " tensors" << std::endl;
  log << in.memory.table() << std::endl;
}

// One step's figures as every rank agrees on them: the loss summed over the world, the
// slowest rank's time and its split (a partition of it), the largest memory, and the
// busiest sender's bytes and their split (a partition of them).
StepMetrics agreed_metrics(int64_t step, double local_loss, double lr, double grad_norm, const plan::Batch& batch,
                           const plan::StepPlan& plan, const StepAccount& a, const dist::Mesh& mesh) {
  // Byte counts travel as doubles: exact below 2^53.
  const Reduced r = reduce_metrics(local_loss,
                                   {a.seconds, a.phases.vision_s, a.phases.attention_s, a.phases.communication_s,
                                    static_cast<double>(a.peak_bytes),
                                    static_cast<double>(a.sent.total()), static_cast<double>(a.sent.attention),
                                    static_cast<double>(a.sent.vision), static_cast<double>(a.sent.grad),
                                    static_cast<double>(a.update_peak_bytes),
                                    static_cast<double>(a.forward_peak_bytes),
                                    static_cast<double>(a.backward_peak_bytes)},
                                   mesh);
  StepMetrics m;
  m.step = step;
  m.loss = r.loss;
  m.lr = lr;
  m.grad_norm = grad_norm;
  for (const auto& s : batch.sequences) {
    const double n = static_cast<double>(s.input_ids.size());
    m.tokens += static_cast<int64_t>(s.input_ids.size());
    m.attention_pairs += 0.5 * n * (n + 1);
  }
  m.label_tokens = plan.label_count;
  const auto& times = r.per_rank[0];
  const size_t slowest = std::max_element(times.begin(), times.end()) - times.begin();
  m.seconds = times[slowest];
  m.vision_s = r.per_rank[1][slowest];
  m.attention_s = r.per_rank[2][slowest];
  m.communication_s = r.per_rank[3][slowest];
  m.other_s = std::max(0.0, m.seconds - m.vision_s - m.attention_s - m.communication_s);
  m.peak_bytes = static_cast<int64_t>(r.max(4));
  m.update_peak_bytes = static_cast<int64_t>(r.max(9));
  m.forward_peak_bytes = static_cast<int64_t>(r.max(10));
  m.backward_peak_bytes = static_cast<int64_t>(r.max(11));
  // The busiest sender's bytes and their parts, so the parts add up to comm_bytes
  // (first such rank on a tie), as the time split is the slowest rank's.
  const auto& sent_by = r.per_rank[5];
  const size_t busiest = std::max_element(sent_by.begin(), sent_by.end()) - sent_by.begin();
  m.comm_bytes = static_cast<int64_t>(sent_by[busiest]);
  m.attention_bytes = static_cast<int64_t>(r.per_rank[6][busiest]);
  m.vision_bytes = static_cast<int64_t>(r.per_rank[7][busiest]);
  m.grad_bytes = static_cast<int64_t>(r.per_rank[8][busiest]);
  return m;
}

// The checkpoint after `step`: the weights (and optimizer) with what a resume needs.
void save_step(const TrainOptions& o, const RunInputs& in, WeightUpdate& update, int64_t step,
               const DataPosition& position, const dist::Mesh& mesh, std::ostream& log) {
  nlohmann::json state;
  state["step"] = step;
  state["cpu_rng"] = capture_cpu_rng();
  state["data"] = {{"epoch", position.epoch}, {"offset", position.offset}};
  state["run"] = run_flags(o, mesh.shape(), in.rows);
  CheckpointOptions ckpt;
  ckpt.keep_last = o.keep;
  ckpt.save_dtype = in.save_dtype;
  ckpt.max_shard_bytes = static_cast<uint64_t>(o.save_shard_bytes);
  if (o.test.crash_checkpoint_step == step) ckpt.crash_after_bytes = o.test.crash_checkpoint_after_bytes;
  ckpt.crash_in_keep = o.test.crash_keep_step == step;
  update.save(o.out, step, state, in.resolved.config_json, ckpt, mesh, log);
}

// The next step's pixels on a thread of their own (--prefetch-pixels), started when this
// step's are in hand: that step's samples, batch and plan come from the data and the plan
// options alone (no collective), so its pixels are those the step would load itself. The
// step takes them only if its samples are those (a test hook may change a rank's).
struct PixelPrefetch {
  std::vector<int64_t> samples;
  std::future<model::PixelInputs> pixels;
};

// The step after this one, planned ahead for its pixels (--prefetch-pixels).
struct NextStep {
  std::vector<int64_t> samples;
  plan::Batch batch;
  plan::StepPlan plan;
};

// What every step of the loop reads, fixed for the run.
struct StepLoop {
  const TrainOptions& o;
  const RunInputs& in;
  const model::Vlm& vlm;
  WeightUpdate& update;
  const LrSchedule& schedule;
  const dist::Mesh& mesh;
  dist::RankActivity& doing;
  PhaseTimer& phases;      // this run's time split, active on this thread
  MemoryCounter& memory;   // this run's tensor bytes
  const parallel::ModelParallelism& parallelism;  // what parallelize installed
  plan::PlanOptions plan_options;
  int64_t loss_chunk = 0;
  std::string fingerprint_prefix;  // this job's step-agreement keys
  int64_t last_step = 0;
  std::optional<PixelPrefetch>* prefetch = nullptr;  // --prefetch-pixels: the next step's, if started
};

// This step's pixels: the prefetched ones when they are this step's, else loaded now.
model::PixelInputs step_pixels(const StepLoop& run, const std::vector<int64_t>& samples, const plan::Batch& batch,
                               const plan::StepPlan& plan) {
  if (run.prefetch && run.prefetch->has_value()) {
    PixelPrefetch ahead = std::move(**run.prefetch);
    run.prefetch->reset();
    // This step's: a decode error surfaces here, in its own step. Another step's (a test
    // hook changed this rank's samples): waited for and dropped, its errors with it.
    if (ahead.samples == samples) return ahead.pixels.get();
    ahead.pixels.wait();
  }
  return load_pixels(*run.in.data, samples, batch, run.in.resolved.config, pixels_encoded_here(plan, run.o.vision),
                     run.in.dtype);
}

// The step after `step`, whose data starts at `position`, when its pixels are to be
// decoded during this one: its samples, batch and plan come from the data and the plan
// options alone (no collective), so they are those the step will make itself.
std::optional<NextStep> plan_next_step(const StepLoop& run, int64_t step, const DataPosition& position) {
  if (!run.prefetch || step >= run.last_step) return std::nullopt;
  DataPosition next = position;
  NextStep n;
  n.samples = run.in.packer->next_step(next);
  n.batch = make_batch(*run.in.data, n.samples);
  n.plan = plan::make_step_plan(n.batch, run.in.resolved.config.conventions, run.plan_options, run.mesh.rank());
  return n;
}

// Starts decoding the next step's pixels on a thread of its own.
void prefetch_pixels(const StepLoop& run, NextStep next) {
  PixelPrefetch ahead;
  ahead.samples = next.samples;
  // The run's inputs outlive the thread (the loop's PixelPrefetch, which joins it, goes first).
  const RunInputs* in = &run.in;
  const PixelsNeeded needed = pixels_encoded_here(next.plan, run.o.vision);
  ahead.pixels = std::async(std::launch::async, [in, needed, next = std::move(next)] {
    return load_pixels(*in->data, next.samples, next.batch, in->resolved.config, needed, in->dtype);
  });
  *run.prefetch = std::move(ahead);
}

// The run's estimate with this step's vision tower: the busiest rank's, which every rank
// computes alike from the plan, so that a step too large for the limit (a long video
// encoded whole) fails on every rank before its first collective. `largest` keeps the
// largest estimate of the run (the figure bench memory compares with the peak).
//
// `next` (--prefetch-pixels): on the CPU its pixels, decoded during this step, count
// too (the largest any rank decodes, which every rank computes alike); when they alone
// would take the step past the limit, `next` is dropped: the next step loads its own.
void check_step_memory(const StepLoop& run, int64_t step, const std::vector<int64_t>& samples,
                       const plan::StepPlan& plan, MemoryEstimate& largest, std::optional<NextStep>& next) {
  const TrainOptions& o = run.o;
  const BusiestVision busiest = busiest_vision(run.in.resolved.config, vision_loads(plan, o.vision),
                                               o.checkpoint_activations, run.in.dtype);
  // The decoder's part again when padding gives a rank more slots than --tokens-per-rank.
  int64_t slots = 0;
  for (const plan::RowPlan& row : plan.rows) slots = std::max(slots, row.shards.local_length());
  MemoryEstimate estimate = slots > o.tokens_per_rank
                                ? estimate_for(run.in.resolved.config, run.in.layout, o, run.in.parsed, run.loss_chunk,
                                               run.mesh.shape(), slots)
                                : run.in.memory;
  estimate.vision = busiest.bytes.kept;
  estimate.vision_working_set = busiest.bytes.transient;
  if (next && !o.device.is_cuda()) {  // on CUDA they wait in host memory, not on the device
    estimate.next_pixels =
        prefetched_pixel_bytes(run.in.resolved.config, vision_loads(next->plan, o.vision), run.in.dtype);
    const bool fits = o.memory_limit_bytes <= 0 || estimate.total() <= o.memory_limit_bytes;
    if (!fits) {
      next.reset();
      estimate.next_pixels = 0;
    }
  }
  if (estimate.total() > largest.total()) largest = estimate;
  if (o.memory_limit_bytes <= 0 || estimate.total() <= o.memory_limit_bytes) return;
  std::ostringstream what;
  what << "step " << step << " (samples";
  for (size_t i = 0; i < samples.size() && i < 8; ++i) what << " " << samples[i];
  what << (samples.size() > 8 ? " …)" : ")");
  const VisionLoad& l = busiest.load;
  if (l.tokens > 0)
    what << ": the vision tower of dp rank " << l.dp << ", context rank " << l.context_rank << " encodes " << l.tokens
         << " patches (its largest item " << l.largest_item << " patches; vision " << format_bytes(busiest.bytes.kept)
         << " kept + " << format_bytes(busiest.bytes.transient) << " in its backward, --vision-split "
         << plan::to_string(o.vision_split) << ")";
  if (slots > o.tokens_per_rank)
    what << (l.tokens > 0 ? "; " : ": ") << "a rank holds " << slots << " slots, padding included, for --tokens-per-rank "
         << o.tokens_per_rank;
  check_memory_fits(estimate, o.memory_limit_bytes, o.memory_limit_source, what.str());
}

// One step: data (the same on every rank) → plan → the step agreed → this rank's
// pixels → forward/backward on its shard → weight update → the agreed figures. The
// heartbeat, the test hooks and the accounting are the StepWatch's (step_watch.h).
// `held_bytes`: what this rank holds as the forward begins (the training state).
StepMetrics run_step(const StepLoop& run, int64_t step, DataPosition& position, int64_t& held_bytes,
                     MemoryEstimate& largest_estimate) {
  const dist::Mesh& mesh = run.mesh;
  const model::ModelConfig& config = run.in.resolved.config;
  StepWatch watch(step, mesh, run.doing, run.phases, run.memory, run.o.test);

  const std::vector<int64_t> samples = watch.samples(run.in.packer->next_step(position));
  const plan::Batch batch = make_batch(*run.in.data, samples);
  watch.phase("plan");
  const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, run.plan_options, mesh.rank());
  std::optional<NextStep> next = plan_next_step(run, step, position);
  check_step_memory(run, step, samples, plan, largest_estimate, next);
  // Every rank must be about to run the same step before the first collective.
  watch.phase("step agreement");
  if (mesh.store())
    agree_on_step(*mesh.store(), run.fingerprint_prefix, step, step_fingerprint(samples, batch, plan), mesh.rank(),
                  mesh.world_size(), mesh.world()->timeout());
  watch.phase("pixels");
  const model::PixelInputs pixels = step_pixels(run, samples, batch, plan).to(run.o.device);
  if (next) prefetch_pixels(run, std::move(*next));

  const double lr = run.schedule.at(step - 1);
  run.update.set_lr(lr);
  run.update.zero_grad();
  held_bytes = watch.held_bytes();
  run.update.begin_step();
  watch.phase("forward");
  auto out = parallel::forward_step(run.vlm, batch, plan, pixels, run.parallelism);
  // The head through the decoder: --shard parameters gathers its weight around the loss.
  // Under it the head is row-sharded: read in rounds of rows, never whole.
  at::Tensor loss = run.vlm.decoder().apply_head(
      [&](const at::Tensor& hidden, const at::Tensor& weight) {
        return chunked_lm_loss(hidden, weight, out.labels, out.label_count, run.loss_chunk);
      },
      out.hidden,
      [&](const at::Tensor& hidden, model::RowShardedWeight& head) {
        return chunked_lm_loss(hidden, head, out.labels, out.label_count,
                               row_sharded_block(run.loss_chunk, run.o.tokens_per_rank, head.vocab(),
                                                 static_cast<int>(head.ranks()),
                                                 head.width() * static_cast<int64_t>(hidden.element_size()),
                                                 static_cast<int64_t>(hidden.element_size()) + 12));
      });
  watch.phase("backward");
  watch.forward_done();
  loss.backward();
  watch.backward_done();
  const double grad_norm = run.update.step(run.o.clip, run.doing);
  const StepAccount account = watch.finish();
  const double local_loss = loss.detach().to(at::kDouble).item<double>();
  return agreed_metrics(step, local_loss, lr, grad_norm, batch, plan, account, mesh);
}

}  // namespace

int64_t longest_tokens_per_rank(const model::ModelConfig& config, const TrainOptions& o, int world,
                                int64_t capacity_bytes, int64_t step, int ring) {
  MMSP_CHECK(capacity_bytes > 0 && step > 0, "longest_tokens_per_rank: capacity ", capacity_bytes, " and step ", step,
             " must be positive");
  MMSP_CHECK(ring >= 0 && ring <= world && (ring == 0 || world % ring == 0), "longest_tokens_per_rank: a ring of ",
             ring, " must divide the ", world, " ranks (0: all of them)");
  const plan::Mesh mesh = ring == 0 ? plan::Mesh{1, world, 1} : plan::Mesh{1, ring, world / ring};
  ParsedTrainOptions parsed;
  parsed.dtype = parse_dtype(o.dtype);
  parsed.shard_level = parallel::parse_shard_level(o.shard);
  const ParameterLayout layout = layout_of(config);
  auto fits = [&](int64_t tokens) {
    TrainOptions t = o;
    t.tokens_per_rank = tokens;
    // --loss-chunk 0 is the default chunk; a negative one stands for "one chunk of all T"
    const int64_t chunk = o.loss_chunk > 0 ? o.loss_chunk : o.loss_chunk < 0 ? tokens : default_loss_chunk(config.text.vocab_size);
    return estimate_for(config, layout, t, parsed, chunk, mesh).total() <= capacity_bytes;
  };
  if (!fits(step)) return 0;
  int64_t lo = step, hi = 2 * step;  // fits(lo); grow hi until it does not
  while (fits(hi)) {
    lo = hi;
    MMSP_CHECK(hi < (int64_t{1} << 40), "longest_tokens_per_rank: no limit below 2^40 tokens");
    hi *= 2;
  }
  while (hi - lo > step) {
    const int64_t mid = (lo + hi) / 2 / step * step;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

namespace {

// --prefetch-pixels resolved: auto is on with a CUDA device.
bool prefetches_pixels(const TrainOptions& o) {
  return o.prefetch_pixels == PrefetchPixels::on || (o.prefetch_pixels == PrefetchPixels::automatic && o.device.is_cuda());
}

// How every step of this run is planned: the mesh, layout, placement and vision split,
// the load report's attention bytes priced for this model and dtype.
plan::PlanOptions plan_options_for(const TrainOptions& o, const RunInputs& in, const dist::Mesh& mesh) {
  plan::PlanOptions p;
  p.mesh = mesh.shape();
  p.layout = o.layout;
  p.placement = o.placement;
  p.placement_balance = o.placement_balance;
  p.vision_split = o.vision_split;
  p.attention_shape =
      model::attention_shape(in.resolved.config.text, static_cast<int64_t>(c10::elementSize(in.dtype)));
  return p;
}

// metrics.jsonl in --out (rank 0 only; none without --out).
std::unique_ptr<MetricsWriter> open_metrics(const std::string& out) {
  if (out.empty()) return nullptr;
  std::filesystem::create_directories(out);
  return std::make_unique<MetricsWriter>(out + "/metrics.jsonl");
}

// A step's line in metrics.jsonl; at the run's first step, the note of a torn last line
// a crash had left (cut when the file was opened).
void write_metrics(MetricsWriter& metrics, const StepMetrics& m, bool first_step, std::ostream& log) {
  metrics.write(m);
  if (metrics.repaired_bytes() > 0 && first_step)
    log << "note: " << metrics.path() << ": cut the torn last line (" << metrics.repaired_bytes()
        << " bytes) a crash had left" << std::endl;
}

// The trained weights, whole and detached (TrainOptions::report_parameters: tests).
std::vector<std::pair<std::string, at::Tensor>> final_parameters(WeightUpdate& update) {
  update.gather_weights();  // every rank: under --shard parameters a collective
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, p] : update.weights()) out.emplace_back(name, p.detach().clone());
  return out;
}

}  // namespace

TrainReport train(const TrainOptions& o, const dist::Mesh& mesh, std::ostream& log,
                  dist::RankActivity* activity) {
  dist::RankActivity no_heartbeat;
  dist::RankActivity& doing = activity ? *activity : no_heartbeat;
  const RunInputs in = check_run(o, mesh);
  const bool rank0 = mesh.rank() == 0;
  // This run's keys in the job's store (step agreements), and the first agreement: every
  // rank is about to load the same model and checkpoint (per-host copies may differ).
  const std::string agreement_prefix = mesh.store() ? fingerprint_key_prefix(*mesh.store(), mesh.rank()) : "";
  if (mesh.store())
    agree_on_loaded_inputs(*mesh.store(), agreement_prefix, loaded_inputs(o, in.resolved, in.checkpoint ? &*in.checkpoint : nullptr),
                           mesh.rank(), mesh.world_size(), mesh.world()->timeout(), mesh.hosts());

  // This run's own counters: the tensors it allocates from here on, and its time split
  // (the phases marked on this thread while it runs).
  MemoryCounter memory(o.device);  // on CUDA: the caching allocator's statistics
  PhaseTimer phases;
  const ActivePhaseTimer timing(phases);
  const Trainable trainable = build_trainable(o, in, mesh);
  model::Vlm& vlm = *trainable.vlm;
  WeightUpdate& update = *trainable.update;
  // A warm-up longer than the run is the run (short test runs keep the default).
  const LrSchedule schedule{o.lr, o.min_lr, std::min(o.warmup, o.steps), o.steps};
  schedule.validate();
  ResumePoint resumed = resume_run(o, in, update, mesh, log);
  TrainReport report;
  report.first_step = resumed.done + 1;
  report.memory_estimate = in.memory;
  if (resumed.done >= o.steps) {
    // A requeue loop that always passes --resume meets a finished run: nothing to do is
    // a success, said once.
    if (rank0)
      log << "note: nothing to do: the run in " << o.resume << " is complete at step " << resumed.done
          << " of --steps " << o.steps << std::endl;
    parallel::unparallelize(vlm);
    return report;
  }

  const std::unique_ptr<MetricsWriter> metrics = rank0 ? open_metrics(o.out) : nullptr;
  if (rank0 && !o.quiet) print_run_header(o, in, update, mesh, log);

  const int64_t last_step = o.stop_after > 0 ? std::min(o.stop_after, o.steps) : o.steps;
  std::optional<PixelPrefetch> prefetched;  // joined before the model goes (declared after it)
  const StepLoop run{o,
                     in,
                     vlm,
                     update,
                     schedule,
                     mesh,
                     doing,
                     phases,
                     memory,
                     trainable.parallelism,
                     plan_options_for(o, in, mesh),
                     in.loss_chunk,
                     agreement_prefix,
                     last_step,
                     prefetches_pixels(o) ? &prefetched : nullptr};

  if (!o.save_gradients.empty()) update.save_next_gradients(o.save_gradients, in.resolved.config_json, mesh, log);
  for (int64_t step = resumed.done + 1; step <= last_step; ++step) {
    const StepMetrics m = run_step(run, step, resumed.position, report.held_bytes, report.memory_estimate);
    report.state_bytes = memory.current_bytes();
    report.summary.add(m);
    if (o.report_steps) report.steps.push_back(m);
    if (rank0 && !o.quiet) log << format_step_line(m) << std::endl;
    if (metrics) write_metrics(*metrics, m, step == report.first_step, log);
    if (!o.out.empty() && (step == last_step || (o.checkpoint_every > 0 && step % o.checkpoint_every == 0))) {
      doing.set_phase("checkpoint");
      save_step(o, in, update, step, resumed.position, mesh, log);
    }
  }
  if (rank0 && report.summary.count() > 0) log << report.summary.table();
  if (o.report_parameters) report.parameters = final_parameters(update);
  parallel::unparallelize(vlm);  // the update goes before the model
  return report;
}

}  // namespace mmsp::train
