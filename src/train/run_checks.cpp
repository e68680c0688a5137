// Flag limits, the --out probe and the resume comparison; see run_checks.h.
#include "mmsp/train/run_checks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <vector>

#include "mmsp/attention/kernel_registry.h"
#include "mmsp/core/check.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/model/lora.h"
#include "mmsp/model/model_parts.h"
#include "mmsp/model/vision/vision_mode.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void check_count(const char* flag, int64_t value, int64_t max, const char* what) {
  MMSP_CHECK(value <= max, flag, " ", value, " is too large: at most ", max, " (", what, ")");
}

void check_finite(const char* flag, double value) {
  MMSP_CHECK(std::isfinite(value), flag, " ", value, " must be a finite number");
}

// A flag of the run object that changes the batches or the numerics, and what follows.
struct Consequential {
  const char* key;
  const char* flag;
  const char* effect;
};
constexpr Consequential kConsequential[] = {
    {"model", "--model", "another model config: the checkpoint's weights may not fit it"},
    {"data", "--data", "other samples: the batches differ from the interrupted run's"},
    {"shapes_samples", "--shapes-samples", "another shapes epoch: the batches differ"},
    {"blank_images", "--blank-images", "other images: the batches differ"},
    {"seed", "--seed", "another data order: the batches differ (the weights come from the checkpoint)"},
    {"shuffle", "--no-shuffle", "another data order: the batches differ"},
    {"tokens_per_step", "--tokens-per-rank × world", "another step budget: the batches differ"},
    {"data_rows", "--data-rows", "other rows: the batches differ"},
    {"steps", "--steps", "another learning-rate schedule (its cosine ends at --steps)"},
    {"warmup", "--warmup", "another learning-rate schedule"},
    {"lr", "--lr", "another learning-rate schedule"},
    {"min_lr", "--min-lr", "another learning-rate schedule"},
    {"dtype", "--dtype", "another precision: the losses differ from the interrupted run's"},
    {"weight_decay", "--weight-decay", "another optimiser: the updates differ"},
    {"clip", "--clip", "another gradient clip: the updates differ"},
    {"freeze", "--freeze", "other parts train: the optimizer state differs"},
    {"lora", "--lora-rank, --lora-alpha, --lora-targets", "other adapters: the checkpoint's may not fit them"},
    {"accumulate", "--accumulate", "another number of micro-steps per step: the batches differ"},
};

// "rank 8, alpha 16, targets q_proj,v_proj" ("" without LoRA): the adapters a resume must fit.
std::string lora_flags(const model::LoraOptions& lora) {
  if (lora.rank == 0) return "";
  const std::string targets =
      model::lora_targets_text(lora.targets.empty() ? model::default_lora_targets() : lora.targets);
  return "rank " + std::to_string(lora.rank) + ", alpha " + detail::concat(lora.alpha) + ", targets " + targets;
}

// The budget of a checkpoint written before "tokens_per_step" was stored, and its dtype by
// the name --dtype's parse gives (a run given "fp32" recorded it so).
json normalised_run(json run) {
  if (run.contains("dtype") && run["dtype"].is_string()) {
    try {
      run["dtype"] = dtype_name(parse_compute_dtype(run["dtype"].get<std::string>()));
    } catch (const Error&) {
      // not a dtype: compared as it is
    }
  }
  if (!run.contains("tokens_per_step") && run.contains("tokens_per_rank") && run.contains("world_size") &&
      run["tokens_per_rank"].is_number_integer() && run["world_size"].is_number_integer())
    run["tokens_per_step"] = run["tokens_per_rank"].get<int64_t>() * run["world_size"].get<int64_t>();
  // Written since --freeze and --accumulate: before them every part trained, one micro-step a step.
  if (!run.contains("freeze")) run["freeze"] = "";
  if (!run.contains("lora")) run["lora"] = "";
  if (!run.contains("accumulate")) run["accumulate"] = 1;
  return run;
}

}  // namespace

void check_train_limits(const TrainOptions& o) {
  check_count("--steps", o.schedule.steps, kMaxSteps, "optimizer steps of the schedule");
  check_count("--stop-after", o.schedule.stop_after, kMaxSteps, "a step of the schedule");
  check_count("--warmup", o.schedule.warmup, kMaxSteps, "steps");
  check_count("--checkpoint-every", o.output.checkpoint_every, kMaxSteps, "steps");
  check_count("--tokens-per-rank", o.inputs.tokens_per_rank, kMaxTokensPerRank,
              "tokens of one rank per step; a step holds this × world");
  check_count("--data-rows", o.inputs.data_rows, kMaxTokensPerRank, "rows of a step");
  check_count("--shapes-samples", o.inputs.shapes_samples, kMaxShapesSamples, "samples of one shapes epoch");
  check_count("--attention-block", o.parallel.attention_block, kMaxAttentionBlock, "query/key block of the kernel");
  check_count("--loss-chunk", o.memory.loss_chunk, kMaxTokensPerRank, "tokens per chunk of the LM head and loss");
  check_count("--accumulate", o.schedule.accumulate, kMaxAccumulate, "micro-steps per optimizer step");
  check_count("--eval-every", o.eval.every, kMaxSteps, "steps");
  MMSP_CHECK(o.inputs.max_image_pixels >= 1 && o.inputs.max_image_pixels <= kMaxImagePixelsBound, "--max-image-pixels ",
             o.inputs.max_image_pixels, " must be in [1, ", kMaxImagePixelsBound, "] (width × height of one image)");
  check_finite("--lr", o.schedule.lr);
  check_finite("--min-lr", o.schedule.min_lr);
  check_finite("--weight-decay", o.schedule.weight_decay);
  check_finite("--clip", o.schedule.clip);
  check_finite("--lora-alpha", o.finetune.lora.alpha);
  check_finite("--peak-tflops", o.output.peak_tflops);
  MMSP_CHECK(o.output.peak_tflops >= 0, "--peak-tflops ", o.output.peak_tflops, " must be ≥ 0 (0: no MFU)");
}

void probe_out_dir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  MMSP_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "--out ", dir,
             " is not a directory (a file of that name is in the way); give a directory path");
  fs::create_directories(dir, ec);
  MMSP_CHECK(!ec, "--out ", dir, ": cannot create the directory: ", ec.message());
  // Hidden and marked ".tmp-": a probe left by a crash is removed with the next save's leftovers.
  char host[128] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string probe = dir + "/.out-probe-" + host + ".tmp-" + std::to_string(::getpid());
  // O_EXCL | O_NOFOLLOW: the name is predictable; a file or link planted there is never written through.
  ::unlink(probe.c_str());
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
  const int error = errno;
  MMSP_CHECK(fd >= 0, "--out ", dir, " is not writable: ", std::strerror(error),
             " (metrics and checkpoints go there; give a directory this rank can write)");
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_error = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  MMSP_CHECK(wrote, "--out ", dir, " is not writable: ", std::strerror(write_error));
}

namespace {
// --attention-kernel as it resolves: auto runs mmsp's blockwise kernel on the CPU, so
// "auto" and "blockwise" agree there; on CUDA auto stays itself (it picks per dtype).
std::string resolved_attention_kernel(const TrainOptions& o) {
  const attention::AttentionKernel kernel = o.parallel.attention_kernel;
  if (kernel.automatic() && !o.parallel.device.is_cuda()) return "blockwise";
  return attention::attention_kernel_name(kernel);
}
}  // namespace

dist::AgreedFlags agreed_flags(const TrainOptions& o) {
  using dist::exact_number;
  const auto n = [](int64_t v) { return std::to_string(v); };
  const auto& t = o.test;
  // --model and --resume are agreed by content once loaded (loaded_inputs.h): per-host
  // copies may sit at other paths. --out by path: it must be one directory every host
  // sees (check_out_shared), given on every rank or none.
  return {{"--out", o.output.out},
          {"--data", o.inputs.data},
          {"--shapes-samples", n(o.inputs.shapes_samples)},
          {"--blank-images", o.inputs.blank_images ? "yes" : "no"},
          {"--max-image-pixels", n(o.inputs.max_image_pixels)},
          {"--dtype", dtype_name(o.inputs.dtype)},
          {"--save-dtype", o.output.save_dtype ? dtype_name(*o.output.save_dtype) : ""},
          {"--save-shard-size", n(o.output.save_shard_bytes)},
          {"--seed", std::to_string(o.inputs.seed)},
          {"--no-shuffle", o.inputs.shuffle ? "no" : "yes"},
          {"--vision", model::to_string(o.parallel.vision)},
          {"--layout", plan::to_string(o.parallel.layout)},
          {"--placement", plan::to_string(o.parallel.placement)},
          {"--vision-split", plan::to_string(o.parallel.vision_split)},
          {"--attention-block", n(o.parallel.attention_block)},
          {"--attention-kernel", resolved_attention_kernel(o)},
          {"--overlap-communication", o.parallel.overlap_communication ? "on" : "off"},
          {"--loss-chunk", n(o.memory.loss_chunk)},
          {"--checkpoint-activations", model::to_string(o.memory.checkpoint_activations)},
          {"--offload-activations", o.memory.offload_activations ? "yes" : "no"},
          {"--tiled-mlp", model::mlp_tile_name(o.memory.tiled_mlp)},
          {"--prefetch-pixels", to_string(o.memory.prefetch_pixels)},
          {"--steps", n(o.schedule.steps)},
          {"--stop-after", n(o.schedule.stop_after)},
          {"--tokens-per-rank", n(o.inputs.tokens_per_rank)},
          {"--data-rows", n(o.inputs.data_rows)},
          {"--lr", exact_number(o.schedule.lr)},
          {"--min-lr", exact_number(o.schedule.min_lr)},
          {"--warmup", n(o.schedule.warmup)},
          {"--weight-decay", exact_number(o.schedule.weight_decay)},
          {"--clip", exact_number(o.schedule.clip)},
          {"--shard", parallel::to_string(o.parallel.shard)},
          {"--checkpoint-every", n(o.output.checkpoint_every)},
          {"--keep", n(o.output.keep)},
          {"--overwrite", o.output.overwrite ? "yes" : "no"},
          {"--save-gradients", o.output.save_gradients},
          {"--allow-changed-flags", o.output.allow_changed_flags ? "yes" : "no"},
          {"test hooks", detail::concat(t.sleep_rank, ":", t.sleep_step, ":", exact_number(t.sleep_seconds), " ",
                                        t.skew_batch_rank, ":", t.skew_batch_step, " ", t.crash_checkpoint_step, ":",
                                        t.crash_checkpoint_after_bytes, " ", t.crash_keep_step)}};
}

json run_flags(const TrainOptions& o, const plan::Mesh& mesh, int data_rows) {
  json run = {{"model", o.inputs.model},
              {"data", o.inputs.data},
              {"dtype", dtype_name(o.inputs.dtype)},
              {"seed", o.inputs.seed},
              {"shuffle", o.inputs.shuffle},
              {"tokens_per_rank", o.inputs.tokens_per_rank},
              {"world_size", mesh.world()},
              {"tokens_per_step", o.inputs.tokens_per_rank * mesh.world()},
              {"data_rows", data_rows},
              {"mesh", mesh.str()},
              {"vision", model::to_string(o.parallel.vision)},
              {"steps", o.schedule.steps},
              {"warmup", o.schedule.warmup},
              {"lr", o.schedule.lr},
              {"min_lr", o.schedule.min_lr},
              {"weight_decay", o.schedule.weight_decay},
              {"clip", o.schedule.clip},
              {"freeze", model::to_string(o.finetune.freeze)},
              {"lora", lora_flags(o.finetune.lora)},
              {"accumulate", o.schedule.accumulate}};
  if (o.objective.kind != Objective::cross_entropy) {  // absent for cross-entropy: older checkpoints match
    const ObjectiveOptions& j = o.objective;
    run["objective"] = {{"kind", to_string(j.kind)},
                        {"loss_agg", to_string(j.agg)},
                        {"clip_ratio_low", j.clip_low},
                        {"clip_ratio_high", j.clip_high},
                        {"clip_ratio_c", j.clip_c},
                        {"kl_coef", j.kl_coef},
                        {"entropy_coef", j.entropy_coef},
                        {"kl", to_string(j.kl)},
                        {"temperature", j.temperature},
                        {"loss_scale", j.loss_scale},
                        {"beta", j.beta},
                        {"label_smoothing", j.label_smoothing},
                        {"old_logprobs", j.old_logprobs_file},
                        {"ref_logprobs", j.ref_logprobs_file}};
  }
  if (o.inputs.data == "shapes") {
    run["shapes_samples"] = o.inputs.shapes_samples;
    run["blank_images"] = o.inputs.blank_images;
  }
  return run;
}

void check_resume_flags(const json& then_in, const json& now_in, bool allow, const std::string& resume,
                        std::ostream* notes) {
  const json then = normalised_run(then_in), now = normalised_run(now_in);
  std::vector<std::string> changes;
  for (const auto& c : kConsequential) {
    if (!then.contains(c.key) || !now.contains(c.key) || then[c.key] == now[c.key]) continue;
    changes.push_back(detail::concat(c.flag, " ", then[c.key].dump(), " -> ", now[c.key].dump(), ": ", c.effect));
  }
  if (changes.empty()) return;
  std::string list;
  for (const auto& c : changes) list += "\n  " + c;
  MMSP_CHECK(allow, "--resume ", resume, ": this run changes ", changes.size(),
             changes.size() == 1 ? " flag" : " flags", " that change the batches or the numerics:", list,
             "\nrun again with the checkpoint's values, or pass --allow-changed-flags to continue anyway");
  if (notes) *notes << "note: --allow-changed-flags: the run differs from the checkpoint's:" << list << std::endl;
}

}  // namespace mmsp::train
