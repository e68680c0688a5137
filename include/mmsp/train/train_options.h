// What a training run is asked to do, in typed sections: the model and its data, the
// parallelism, the memory trade-offs, the schedule, the output, and the test hooks apart.
// Every value a flag names (a dtype, a ZeRO level, a kernel) is parsed once, by the CLI,
// into the type the library uses (the parse_* functions here and beside the types).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mmsp/attention/kernel_registry.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/lora.h"
#include "mmsp/model/model_parts.h"
#include "mmsp/model/vision/vision_mode.h"
#include "mmsp/parallel/zero/shard_level.h"
#include "mmsp/plan/mesh.h"
#include "mmsp/plan/placement.h"
#include "mmsp/plan/vision_split.h"
#include "mmsp/train/objective/objective_options.h"

namespace mmsp::train {

inline plan::VisionSplitOptions automatic_vision_split() {
  plan::VisionSplitOptions o;
  o.mode = plan::VisionSplitOptions::Mode::automatic;
  return o;
}

// --prefetch-pixels off | on | auto.
enum class PrefetchPixels { off, on, automatic };
PrefetchPixels parse_prefetch_pixels(const std::string& name);
std::string to_string(PrefetchPixels mode);

// --dtype: float32 | float64 | bfloat16 (fp32, fp64, bf16); an error names the value.
at::ScalarType parse_compute_dtype(const std::string& name);
// --save-dtype: empty (as the weights came) or float16 | float32 | float64 | bfloat16.
std::optional<at::ScalarType> parse_save_dtype(const std::string& name);
// "float32", "bfloat16", ...: the names the flags take (and checkpoints record).
std::string dtype_name(at::ScalarType type);
// The optimizer side of a compute dtype: bf16 trains with fp32 masters.
inline at::ScalarType master_dtype_of(at::ScalarType compute) {
  return compute == at::kBFloat16 ? at::kFloat : compute;
}

// The model, the data and the step's budget: what the batches and the numerics are.
struct InputOptions {
  std::string model = "shapes-qwen2-vl";  // a built-in name, a model directory or a config.json path
  std::string data = "shapes";            // "shapes" (built in) or a .jsonl file
  int64_t shapes_samples = 100000;        // samples per epoch of the shapes dataset
  int64_t max_image_pixels = 16777216;    // width × height of one image file at most (header checked at load)
  bool blank_images = false;              // shapes with constant images: the text-only baseline
  // float32 or float64: parameters, activations and optimizer in that dtype; bfloat16:
  // mixed precision (bf16 compute weights and activations, fp32 masters, gradients for
  // the reduction and AdamW moments; loss and softmax statistics in fp32).
  at::ScalarType dtype = at::kFloat;
  uint64_t seed = 0;  // parameters and data order
  bool shuffle = true;
  int64_t tokens_per_rank = 256;  // a step holds at most tokens_per_rank × world tokens
  // The step's samples are packed for this many data-parallel rows of
  // tokens_per_rank × world / data_rows tokens each (0: the mesh's dp). The batches
  // depend only on (tokens_per_rank × world, data_rows): a run on another mesh, or on
  // one process, with the same two values reads the same batches.
  int data_rows = 0;
};

// How the model and the step spread over the mesh (the mesh itself comes from the caller).
struct ParallelOptions {
  model::VisionMode vision = model::VisionMode::routed;
  plan::Layout layout = plan::Layout::zigzag;
  // adaptive: short segments whole on one context rank, long ones split (docs/plan.md); the
  // same numerics as zigzag (the attention masks follow the plan's layouts)
  plan::Placement placement = plan::Placement::zigzag;
  plan::PlacementOptions placement_balance;  // the balance adaptive must reach (tests loosen it)
  // vision-tower SP (plan/vision_split.h): items the rule picks are encoded by the whole
  // context group; the same numerics as whole items
  plan::VisionSplitOptions vision_split = automatic_vision_split();
  int64_t attention_block = 256;  // query and key block of the attention kernel
  // auto or a kernel of the registry (attention/kernel_registry.h): auto on CUDA runs the
  // fastest kernel that passes an exactness probe (attention/kernel_choice.h), mmsp's
  // blockwise kernel on the CPU
  attention::AttentionKernel attention_kernel;  // automatic
  // The ring's exchanges and ZeRO-3's gathers issued before the compute that hides them
  // (parallel::ParallelizeOptions::overlap_communication); off for measuring, same bits.
  bool overlap_communication = true;
  // Where this rank computes: parameters, masters, optimizer state, activations, pixels
  // and the loss; the plan and the files stay on the host (cli: --device, rank_device.h).
  c10::Device device{c10::kCPU};
  // none: every rank holds the whole optimizer state; optimizer: the masters and AdamW
  // moments split over the ranks the gradients sum over (ZeRO-1, weight_update.h);
  // gradients: and the gradients (ZeRO-2); parameters: and the weights of every hooked
  // unit, gathered around each use (ZeRO-3; model::Vlm::hook_units). Any level may resume
  // a checkpoint saved with any other, on any number of ranks.
  parallel::ShardLevel shard = parallel::ShardLevel::none;
};

// What trades compute or bytes for memory (none changes the numerics), and the preflight.
struct MemoryOptions {
  // tokens per chunk of the LM head + loss (0: default_loss_chunk, ≤ 256 MiB of fp32 logits)
  int64_t loss_chunk = 0;
  model::ActivationCheckpointing checkpoint_activations = model::ActivationCheckpointing::none;
  // The recomputed layers' inputs in host memory until their backward (model/hooks/activation_offload.h);
  // needs checkpoint_activations decoder or all.
  bool offload_activations = false;
  // The decoder's MLPs over tiles of this many tokens (model/layers/tiled_mlp.h): 0 off,
  // model::kAutoMlpTile (tiles of at most hidden_size tokens). Exact up to the order in
  // which the weights' gradients are summed.
  int64_t tiled_mlp = 0;
  // Decode the next step's images and videos on a thread of their own while this step
  // trains (the same pixels, made from the data and the plan alone; they are held one step
  // early). auto: on with a CUDA device (the pixels wait in host memory, and the host's
  // cores are free during the step), off on the CPU (the decode shares the cores with
  // the step). On the CPU the next step's pixels count in each step's memory check, and
  // a step they would take past the memory limit leaves the next step to load its own.
  PrefetchPixels prefetch_pixels = PrefetchPixels::automatic;
  // Memory preflight: stop before allocating when the estimate exceeds this many bytes
  // per rank (0: no check). The CLI sets it from --memory-limit or the host's available
  // memory divided by the ranks on the host.
  int64_t limit_bytes = 0;
  std::string limit_source = "--memory-limit";
};

// The steps and the optimizer.
struct ScheduleOptions {
  int64_t steps = 100;     // length of the schedule
  int64_t stop_after = 0;  // > 0: stop (with a checkpoint) after this step, e.g. a job's time limit
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 10;  // linear warm-up steps
  double weight_decay = 0.01, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double clip = 1.0;  // global gradient norm to clip to; ≤ 0: no clipping
  // Micro-steps per optimizer step (--accumulate): the step's K batches, each planned and
  // run forward and backward in turn, their gradients summed and normalised by the label
  // tokens of all K: one process's step on their union, at the memory of one.
  int64_t accumulate = 1;
};

// What the run writes and reports.
struct OutputOptions {
  std::string out;               // directory of metrics.jsonl and checkpoints; empty: none
  int64_t checkpoint_every = 0;  // 0: only at the end (when out is set)
  int keep = 2;                  // checkpoints to keep; 0: all
  std::string resume;            // a checkpoint directory (or a run directory) to continue
  // A fresh run into an --out that holds another run's metrics or checkpoints: refused,
  // unless this is set (they are deleted first). The CLI checks it with --out's lock
  // (checkpoint/run_directory.h); train() itself takes no lock.
  bool overwrite = false;
  // The first step's gradients (summed over the world, before clipping) written as a
  // Hugging Face model directory here (rank 0; must not exist or be empty); the run goes
  // on. For comparing a run with a reference such as transformers. --shard none only.
  std::string save_gradients;
  bool allow_changed_flags = false;  // resume even if flags that change batches or numerics differ
  bool quiet = false;                // rank 0 prints no per-step line (the summary always)
  // The device's peak FLOP/s in TFLOP/s (--peak-tflops): the step line's MFU is the model
  // FLOPs a step achieves against it (0: no MFU, the achieved TFLOP/s alone).
  double peak_tflops = 0;
  // TrainReport::parameters: every rank gathers the whole model at the end and copies it
  // (the equivalence tests compare them). The CLI turns it off: for a released model
  // that is two more copies of it on every rank (3.4 GB for Qwen3.5-0.8B in bf16).
  bool report_parameters = true;
  // TrainReport::steps keeps every step's metrics (tests compare them); the CLI, whose
  // metrics.jsonl has them, keeps the summary alone, so a long run's memory stays flat.
  bool report_steps = true;
  // hf/ of each checkpoint: its dtype (unset: the dtype the weights were loaded in, or the
  // training weights' dtype for a config) and its largest shard in bytes (transformers'
  // max_shard_size).
  std::optional<at::ScalarType> save_dtype;
  int64_t save_shard_bytes = 5'000'000'000;
};

// TEST HOOKS (the reliability and crash tests only; set by the CLI from hidden flags
// and MMSP_TEST_CRASH_CHECKPOINT): rank `sleep_rank` sleeps `sleep_seconds` inside the
// forward of step `sleep_step` (a long step must not look hung); rank `skew_batch_rank`
// drops the last sample of step `skew_batch_step` (a diverging rank must be named
// before it hangs); the save of the checkpoint of step `crash_checkpoint_step` exits
// the process after `crash_checkpoint_after_bytes` bytes (CheckpointOptions::
// crash_after_bytes: a crash mid-save must leave the previous checkpoint loadable).
// −1: off.
struct TestHooks {
  int sleep_rank = -1;
  int64_t sleep_step = 0;
  double sleep_seconds = 0;
  int skew_batch_rank = -1;
  int64_t skew_batch_step = 0;
  int64_t crash_checkpoint_step = -1;
  int64_t crash_checkpoint_after_bytes = -1;
  int64_t crash_keep_step = -1;  // the --keep rotation of this step's save exits after its first rename
};

// What a fine-tuning run trains (docs/finetune.md#freezing-parts---freeze).
struct FinetuneOptions {
  // Parts that do not train: no gradient, no master, no optimizer state, no reduction; a
  // frozen tower's backward is not run (nothing below it trains).
  std::vector<model::ModelPart> freeze;
  // LoRA (--lora-rank R, --lora-alpha A, --lora-targets): adapters on the targeted maps
  // (model/lora.h), drawn from the seed, and every other weight frozen. Each checkpoint
  // then holds adapter/ (peft's directory) and hf/ the merged model.
  model::LoraOptions lora;
  // --model ADAPTER_DIR (train/adapter_start.h): a peft LoRA adapter directory whose
  // lora_A and lora_B the adapters start from (their rank, alpha and targets are its own;
  // inputs.model is then its base). Empty: adapters drawn from the seed.
  std::string lora_adapter;
};

// A held-out set's loss, on the mesh, without gradients (docs/finetune.md#evaluation).
struct EvalOptions {
  std::string data;   // a .jsonl file of the --data format; empty: no evaluation
  int64_t every = 0;  // after every N optimizer steps (0: only after the last step)
};

struct TrainOptions {
  ObjectiveOptions objective;  // cross-entropy, or GRPO / PPO on the rollouts' numbers
  InputOptions inputs;
  ParallelOptions parallel;
  MemoryOptions memory;
  ScheduleOptions schedule;
  OutputOptions output;
  TestHooks test;
  FinetuneOptions finetune;
  EvalOptions eval;
};

}  // namespace mmsp::train
