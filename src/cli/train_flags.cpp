// `mmsp train`'s flags; see train_flags.h.
#include "train_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "byte_size.h"
#include "mmsp/core/check.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/model/model_parts.h"
#include "mmsp/model/vision/vision_mode.h"
#include "mmsp/plan/mesh.h"
#include "mmsp/plan/placement.h"
#include "mmsp/plan/vision_split.h"
#include "mmsp/train/adapter_start.h"
#include "mmsp/train/memory/cuda_memory.h"

namespace mmsp::cli {

void TrainFlags::add_to(CLI::App& app) {
  add_model_and_data(app);
  add_schedule(app);
  add_memory(app);
  add_run_directory(app);
  add_finetune(app);
  add_objective(app);
  app.add_option("--test-sleep-in-step", test_sleep)->group("");
  app.add_option("--test-skew-batch", test_skew)->group("");
}

// The model, the data and how a step is cut: what the batches and the numerics are.
void TrainFlags::add_model_and_data(CLI::App& app) {
  app.add_option("--model", options.inputs.model,
                 "built-in model name, a Hugging Face model directory (its weights), a config.json (random weights) "
                 "or a peft LoRA adapter directory to continue (docs/finetune-options.md)")
      ->capture_default_str();
  app.add_option("--base-model", base_model,
                 "the base model directory of a peft adapter given as --model (default: its "
                 "base_model_name_or_path)");
  app.add_option("--data", options.inputs.data, "'shapes' (built in) or a JSON-lines file (docs/data.md)")
      ->capture_default_str();
  app.add_option("--vision", vision, "routed, gather or replicate")->capture_default_str();
  app.add_option("--layout", layout, "zigzag or contiguous")->capture_default_str();
  app.add_option("--placement", placement,
                 "zigzag (every segment split over the context group) or adaptive (short ones whole on one rank)")
      ->capture_default_str();
  app.add_option("--vision-split", vision_split,
                 "encode an image or video over the whole context group: auto (one costing more than a rank's "
                 "share, of at least 4096 patches), off, or a patch count (every item of at least that many)")
      ->capture_default_str();
  app.add_option("--tokens-per-rank", options.inputs.tokens_per_rank,
                 "tokens per rank and step (a step holds at most this × world tokens)")
      ->capture_default_str();
  app.add_option("--data-rows", options.inputs.data_rows,
                 "pack each step for this many dp rows (default: --dp); same value, same batches on any mesh")
      ->capture_default_str();
  app.add_option("--dtype", dtype, "float32, float64 or bfloat16 (mixed: bf16 compute, fp32 master weights)")
      ->capture_default_str();
  app.add_option("--seed", options.inputs.seed, "parameters and data order")->capture_default_str();
  app.add_flag("!--no-shuffle", options.inputs.shuffle, "read samples in file order");
  app.add_option("--shapes-samples", options.inputs.shapes_samples, "samples per epoch of the shapes dataset")
      ->capture_default_str();
  app.add_flag("--blank-images", options.inputs.blank_images, "shapes with constant images (the text-only baseline)");
  app.add_option("--max-image-pixels", options.inputs.max_image_pixels,
                 "refuse image files larger than this (width × height, read from the header at load)")
      ->capture_default_str();
  app.add_option("--attention-block", options.parallel.attention_block, "query/key block of the attention kernel")
      ->capture_default_str();
  app.add_option("--attention-kernel", attention_kernel,
                 "auto | fused | cudnn | blockwise: the local attention kernel (auto: on CUDA the fastest kernel "
                 "that passes an exactness probe against the blockwise one, measured before the first step; "
                 "mmsp's blockwise kernel on the CPU)")
      ->capture_default_str();
  app.add_option("--overlap-communication", overlap_communication,
                 "on: the ring's next K/V and dK/dV and ZeRO-3's next gather issued before the compute that "
                 "hides them; off: each waited for where it is issued (for measuring; the same results, bit "
                 "for bit)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

// Steps and the optimizer.
void TrainFlags::add_schedule(CLI::App& app) {
  app.add_option("--steps", options.schedule.steps, "optimizer steps")->capture_default_str();
  app.add_option("--stop-after", options.schedule.stop_after, "stop after this step (checkpointed), resume later")
      ->capture_default_str();
  app.add_option("--lr", options.schedule.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", options.schedule.min_lr, "learning rate at the end of the cosine")->capture_default_str();
  app.add_option("--warmup", options.schedule.warmup, "linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", options.schedule.weight_decay, "AdamW weight decay (matrices only)")
      ->capture_default_str();
  app.add_option("--clip", options.schedule.clip, "clip gradients to this global norm (0: off)")->capture_default_str();
  app.add_option("--shard", shard,
                 "none; optimizer: fp32 masters and AdamW moments split over every rank (ZeRO-1); "
                 "gradients: and the gradients (ZeRO-2); parameters: and the weights of the decoder layers, "
                 "LM head, embedding and vision blocks (ZeRO-3)")
      ->capture_default_str();
}

// What trades compute or bytes for memory, and the preflight's limit.
void TrainFlags::add_memory(CLI::App& app) {
  app.add_option("--memory-limit", memory_limit,
                 "stop before allocating if the per-rank estimate exceeds this (e.g. 20GiB; 0: off; "
                 "auto: available memory / ranks on this host)")
      ->capture_default_str();
  app.add_option("--loss-chunk", options.memory.loss_chunk,
                 "tokens per chunk of the LM head and loss (0: as many as fit 256 MiB of fp32 logits)")
      ->capture_default_str();
  app.add_option("--checkpoint-activations", checkpointing,
                 "none, decoder (recompute each decoder layer in the backward) or all (and each vision block)")
      ->capture_default_str();
  app.add_flag("--offload-activations", options.memory.offload_activations,
               "keep the recomputed layers' inputs in host memory until their backward (needs "
               "--checkpoint-activations; on CUDA the copies overlap the compute)");
  // An optional value: a bare --prefetch-pixels is on, as it was when it was a switch.
  app.add_option("--prefetch-pixels", prefetch_pixels,
                 "off, on or auto (the default; on with --device cuda); bare: on. Decode "
                 "the next step's images and videos on a thread while this step trains (the same pixels, held "
                 "one step early; on the CPU counted in each step's memory check)")
      ->expected(0, 1)
      ->check(CLI::Validator(
          [](const std::string& value) {  // empty: bare (parse() reads it as on)
            return value.empty() || value == "off" || value == "on" || value == "auto" ? std::string()
                                                                                       : "must be off, on or auto";
          },
          "{off,on,auto}"));
  app.add_option("--tiled-mlp", tiled_mlp,
                 "off, auto (tiles of at most hidden-size tokens) or N: each decoder MLP runs over tiles of N "
                 "tokens, forward and backward, so its [tokens, intermediate] activations exist one tile at a time; "
                 "a hybrid model's Gated DeltaNet token mixers run over sequence tiles too (where no --ring is)")
      ->capture_default_str();
}

// --out: metrics, checkpoints, resume, the hf/ directories a checkpoint holds.
void TrainFlags::add_run_directory(CLI::App& app) {
  app.add_option("--save-dtype", save_dtype,
                 "dtype of each checkpoint's hf/ directory (default: as the weights were loaded)");
  app.add_option("--save-shard-size", save_shard_size, "largest safetensors shard of hf/ (e.g. 5GB, 500MB)")
      ->capture_default_str();
  app.add_option("--out", options.output.out, "directory for metrics.jsonl and checkpoints");
  app.add_option("--checkpoint-every", options.output.checkpoint_every, "save every N steps (and at the end)")
      ->capture_default_str();
  app.add_option("--keep", options.output.keep, "checkpoints to keep (0: all)")->capture_default_str();
  app.add_option("--resume", options.output.resume, "continue from this checkpoint or run directory");
  app.add_flag("--overwrite", options.output.overwrite,
               "start afresh in an --out that holds another run: its metrics and checkpoints are deleted first");
  app.add_option("--save-gradients", options.output.save_gradients,
                 "write the first step's gradients (summed over the ranks, before --clip) as a model directory "
                 "here, to compare with a reference (--shard none)");
  app.add_flag("--allow-changed-flags", options.output.allow_changed_flags,
               "resume although flags that change the batches or the numerics differ from the checkpoint's");
  app.add_flag("--quiet", options.output.quiet, "no per-step lines (the summary still prints)");
}

// What a fine-tuning recipe sets: the parts that train, micro-steps, the held-out set.
// What a step minimises: the cross-entropy, or an RL objective on the rollouts' numbers
// (docs/rl.md); verl's names for its knobs.
void TrainFlags::add_objective(CLI::App& app) {
  const char* group = "Objective (docs/rl.md)";
  app.add_option("--objective", objective,
                 "cross-entropy; grpo / ppo: the clipped surrogate on each line's advantages, old_logprobs "
                 "and ref_logprobs; dpo: preference pairs' sigmoid loss")
      ->capture_default_str()
      ->group(group);
  app.add_option("--loss-agg", loss_agg,
                 "token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm (default: grpo "
                 "seq-mean-token-mean, ppo token-mean)")
      ->group(group);
  clip_flag = app.add_option("--clip-ratio", clip_ratio, "the importance ratio's clip range: [1 - it, 1 + it]")
                  ->capture_default_str()
                  ->group(group);
  app.add_option("--clip-ratio-low", clip_low, "the range's lower side (default --clip-ratio)")->group(group);
  app.add_option("--clip-ratio-high", clip_high, "the range's upper side (default --clip-ratio; DAPO: 0.28)")
      ->group(group);
  clip_c_flag = app.add_option("--clip-ratio-c", options.objective.clip_c,
                               "dual clip for negative advantages, > 1 (default: ppo 3, grpo off; 0: off)")
                    ->group(group);
  app.add_option("--kl-coef", options.objective.kl_coef,
                 "× the KL to the reference (each line's ref_logprobs); 0: no reference")
      ->capture_default_str()
      ->group(group);
  app.add_option("--entropy-coef", options.objective.entropy_coef,
                 "− × the aggregated entropy of the policy at each labelled token (verl's entropy_coeff)")
      ->capture_default_str()
      ->group(group);
  app.add_option("--kl", kl, "the KL estimator: k1, k2 or k3 (low_var_kl)")->capture_default_str()->group(group);
  app.add_option("--temperature", options.objective.temperature,
                 "the logits are divided by it (the rollout's sampling temperature)")
      ->capture_default_str()
      ->group(group);
  app.add_option("--beta", options.objective.beta, "DPO: the implicit reward's scale (TRL's beta)")
      ->capture_default_str()
      ->group(group);
  app.add_option("--label-smoothing", options.objective.label_smoothing,
                 "DPO: cDPO's chance that a pair's preference is flipped, in [0, 0.5)")
      ->capture_default_str()
      ->group(group);
  app.add_option("--old-logprobs", options.objective.old_logprobs_file,
                 "mmsp logprobs' --out over the same --data: every sample's old_logprobs (GRPO, PPO)")
      ->group(group);
  app.add_option("--ref-logprobs", options.objective.ref_logprobs_file,
                 "mmsp logprobs' --out of the reference model over the same --data: ref_logprobs (DPO: their sums)")
      ->group(group);
  app.add_option("--loss-scale", options.objective.loss_scale,
                 "seq-mean-token-sum-norm's divisor (Dr. GRPO's constant)")
      ->group(group);
}

void TrainFlags::add_finetune(CLI::App& app) {
  app.add_option("--freeze", freeze,
                 "parts that do not train, comma-separated: vision, merger, llm, embeddings (docs/finetune.md)");
  app.add_option("--accumulate", options.schedule.accumulate,
                 "micro-steps per optimizer step: K batches, gradients summed, normalised over all K's labels")
      ->capture_default_str();
  lora_rank_flag =
      app.add_option("--lora-rank", options.finetune.lora.rank,
                     "train LoRA adapters of this rank (every other weight frozen); checkpoints hold adapter/ (peft) "
                     "and hf/ merged");
  lora_alpha_flag =
      app.add_option("--lora-alpha", options.finetune.lora.alpha, "LoRA's alpha: the adapters' scale is alpha / rank")
          ->capture_default_str();
  app.add_option("--lora-targets", lora_targets,
                 "maps to adapt, by module name (default q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; "
                 "vision.NAME: the tower's)");
  app.add_option("--peak-tflops", options.output.peak_tflops,
                 "the device's peak TFLOP/s: the step line then shows the estimated MFU");
  app.add_option("--eval-data", options.eval.data,
                 "a held-out JSON-lines file: its loss after --eval-every steps and at the end");
  app.add_option("--eval-every", options.eval.every, "evaluate after every N steps (0: only at the end)")
      ->capture_default_str();
}

void TrainFlags::read_test_hooks() {
  auto& t = options.test;
  if (!test_sleep.empty())
    MMSP_CHECK(std::sscanf(test_sleep.c_str(), "%d:%ld:%lf", &t.sleep_rank, &t.sleep_step, &t.sleep_seconds) == 3,
               "--test-sleep-in-step '", test_sleep, "' must be RANK:STEP:SECONDS");
  if (!test_skew.empty())
    MMSP_CHECK(std::sscanf(test_skew.c_str(), "%d:%ld", &t.skew_batch_rank, &t.skew_batch_step) == 2,
               "--test-skew-batch '", test_skew, "' must be RANK:STEP");
  // The crash test (tests/train/train_cli.sh) sets "STEP:BYTES" in the environment,
  // which mmsp-run hands to every rank: the save of step STEP dies after BYTES bytes.
  if (const char* crash = std::getenv("MMSP_TEST_CRASH_CHECKPOINT"))
    MMSP_CHECK(std::sscanf(crash, "%ld:%ld", &t.crash_checkpoint_step, &t.crash_checkpoint_after_bytes) == 2,
               "MMSP_TEST_CRASH_CHECKPOINT '", crash, "' must be STEP:BYTES");
  if (const char* crash = std::getenv("MMSP_TEST_CRASH_IN_KEEP"))  // "STEP": see TestHooks
    MMSP_CHECK(std::sscanf(crash, "%ld", &t.crash_keep_step) == 1, "MMSP_TEST_CRASH_IN_KEEP '", crash,
               "' must be a step");
}

void TrainFlags::parse() {
  read_test_hooks();
  train::TrainOptions& o = options;
  o.parallel.vision = model::parse_vision_mode(vision);
  o.parallel.layout = plan::parse_layout(layout);
  o.parallel.placement = plan::parse_placement(placement);
  o.parallel.vision_split = plan::parse_vision_split(vision_split);
  MMSP_CHECK(o.parallel.placement == plan::Placement::zigzag || o.parallel.layout == plan::Layout::zigzag,
             "--placement adaptive splits long segments in zigzag order; it needs --layout zigzag, not ",
             plan::to_string(o.parallel.layout));
  o.memory.checkpoint_activations = model::parse_activation_checkpointing(checkpointing);
  o.memory.tiled_mlp = model::parse_mlp_tile(tiled_mlp);
  o.memory.prefetch_pixels = train::parse_prefetch_pixels(prefetch_pixels.empty() ? "on" : prefetch_pixels);
  o.output.save_shard_bytes = parse_byte_size(save_shard_size, "--save-shard-size");
  o.inputs.dtype = train::parse_compute_dtype(dtype);
  o.output.save_dtype = train::parse_save_dtype(save_dtype);
  o.parallel.shard = parallel::parse_shard_level(shard);
  o.parallel.attention_kernel = attention::parse_attention_kernel(attention_kernel);
  o.parallel.overlap_communication = overlap_communication == "on";
  o.finetune.freeze = model::parse_model_parts(freeze, "--freeze");
  parse_objective();
  if (!lora_targets.empty()) o.finetune.lora.targets = model::parse_lora_targets(lora_targets);
  MMSP_CHECK(!lora_rank_flag || lora_rank_flag->count() == 0 || o.finetune.lora.rank >= 1, "--lora-rank ",
             o.finetune.lora.rank, " must be ≥ 1 (the adapters' rank; leave the flag out to train every weight)");
  train::AdapterFlags given;  // --model ADAPTER_DIR: the adapter's LoRA unless a flag contradicts it
  given.rank = lora_rank_flag && lora_rank_flag->count() > 0;
  given.alpha = lora_alpha_flag && lora_alpha_flag->count() > 0;
  given.targets = !lora_targets.empty();
  given.base_model = base_model;
  train::start_from_peft_adapter(o, given);
  MMSP_CHECK(o.finetune.lora.rank != 0 || lora_targets.empty(), "--lora-targets ", lora_targets,
             " needs --lora-rank R (the adapters' rank)");
}

void TrainFlags::place(const dist::RankEnv& env, const c10::Device& device) {
  train::TrainOptions& o = options;
  o.parallel.device = device;
  if (memory_limit == "auto" && device.is_cuda()) {
    o.memory.limit_bytes = train::cuda_free_bytes(device.index());
    o.memory.limit_source = "the free memory of " + device.str();
  } else if (memory_limit == "auto") {
    o.memory.limit_bytes = host_available_memory() / std::max(1, env.local_world_size);
    o.memory.limit_source =
        "this host's available memory divided by its " + std::to_string(env.local_world_size) + " rank(s)";
  } else {
    o.memory.limit_bytes = parse_byte_size(memory_limit, "--memory-limit");
  }
}

// --objective and its knobs: the objective's defaults, then what was given.
void TrainFlags::parse_objective() {
  train::ObjectiveOptions& j = options.objective;
  const train::ObjectiveOptions given = j;
  j = train::objective_defaults(train::parse_objective(objective));
  if (clip_c_flag && clip_c_flag->count() > 0) j.clip_c = given.clip_c;
  j.kl_coef = given.kl_coef;
  j.entropy_coef = given.entropy_coef;
  j.temperature = given.temperature;
  j.loss_scale = given.loss_scale;
  j.beta = given.beta;
  j.label_smoothing = given.label_smoothing;
  j.old_logprobs_file = given.old_logprobs_file;
  j.ref_logprobs_file = given.ref_logprobs_file;
  if (!loss_agg.empty()) j.agg = train::parse_loss_agg(loss_agg);
  j.kl = train::parse_kl_kind(kl);
  j.clip_low = clip_low >= 0 ? clip_low : clip_ratio;
  j.clip_high = clip_high >= 0 ? clip_high : clip_ratio;
  const bool rl = j.kind != train::Objective::cross_entropy;
  const bool policy_knobs = !loss_agg.empty() || j.kl_coef != 0 || (clip_flag && clip_flag->count() > 0) ||
                            clip_low >= 0 || clip_high >= 0 || (clip_c_flag && clip_c_flag->count() > 0) ||
                            j.loss_scale != 0 || kl != "k3" || j.entropy_coef != 0;
  const bool dpo_knobs = j.beta != train::ObjectiveOptions{}.beta || j.label_smoothing != 0;
  MMSP_CHECK(rl || (!policy_knobs && !dpo_knobs && j.temperature == 1.0),
             "--loss-agg, --clip-ratio*, --kl-coef, --kl, --entropy-coef, --loss-scale, --beta, --label-smoothing and ",
             "--temperature ", "are read by an RL --objective (grpo, ppo, dpo), not cross-entropy");
  MMSP_CHECK(j.kind != train::Objective::dpo || !policy_knobs,
             "--loss-agg, --clip-ratio*, --kl-coef and --loss-scale are GRPO's and PPO's; --objective dpo reads ",
             "--beta and --label-smoothing");
  MMSP_CHECK(!rl || j.kind == train::Objective::dpo || !dpo_knobs,
             "--beta and --label-smoothing are DPO's; --objective ", objective,
             " reads --clip-ratio*, --kl-coef, --loss-agg");
}

}  // namespace mmsp::cli
