// `mmsp bench memory`: per-rank memory of a training step under the memory flags
// (--shard, --checkpoint-activations, --loss-chunk), measured by the counting allocator
// next to the preflight's analytical breakdown, for each model config given, on the
// ranks of this job (run it under mmsp-run -n 1, 2 and 4).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "mmsp/dist/rank_device.h"
#include "mmsp/dist/rank_env.h"
#include "scaled_config.h"

namespace mmsp::bench {

struct MemoryBenchOptions {
  // Config files (configs/…json, a Hugging Face config.json) or built-in model names.
  std::vector<std::string> models = {"configs/tiny-qwen2-vl.json", "configs/tiny-qwen3_5-vl.json"};
  // Each model at the width it has, with fewer layers, vision blocks or words where the
  // machine cannot hold all of them (0: as released).
  ConfigScale scale;
  int64_t tokens_per_rank = 256;
  int64_t loss_chunk = 0;  // tokens per chunk in the chunked rows (0: the trainer's default, ≤ 256 MiB of logits)
  std::string dtype = "float32";
  int64_t steps = 2;  // the last step's figures are reported (the first allocates the optimizer state)
  // Only the rows of these --shard levels (empty: every row). A released config that
  // cannot start unsharded on this machine is measured with `parameters` alone.
  std::vector<std::string> shards;
  // Only the rows of these --checkpoint-activations modes (empty: every row).
  std::vector<std::string> checkpointing;
  // Where every rank trains (cli: --device; rank_device.h): on CUDA the rows also give
  // tokens/s and the model FLOPs utilisation against `peak_tflops`.
  c10::Device device{c10::kCPU};
  dist::GpuCollectives gpu_collectives = dist::GpuCollectives::none;
  double peak_tflops = 989;  // dense bf16 of an H100/H200 SXM (NVIDIA's datasheet)
  std::string attention_kernel = "auto";
  // Non-empty: no training; for each capacity (bytes of one device), model and row, the most
  // tokens per rank whose preflight estimate fits (train::longest_tokens_per_rank).
  std::vector<int64_t> longest_bytes;
  int longest_ranks = 0;  // the ranks the state is sharded over in those figures (0: this job's)
  int longest_ring = 0;   // ... of which the context group's ring (0: all; the rest Ulysses)
  // Every row with these parts frozen (--freeze, "vision,merger") or LoRA adapters of this
  // rank on the decoder's projections (--lora-rank; 0: none): their state beside full
  // fine-tuning's.
  std::string freeze;
  int64_t lora_rank = 0;
  // Expert parallelism (mixture-of-experts models): each block of this many ranks splits
  // every layer's experts, in the measured rows (--shard none only) and in --longest's.
  int expert = 1;
  // Called on rank 0 with the rows so far, after each row: a run cut short keeps them.
  std::function<void(const nlohmann::json& result)> on_row;
};

// Every rank calls it; rank 0's result holds the rows.
nlohmann::json bench_memory(const dist::RankEnv& env, const MemoryBenchOptions& options);

}  // namespace mmsp::bench
