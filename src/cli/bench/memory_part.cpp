// `mmsp bench memory`: a training step's memory per rank under the memory flags,
// measured next to the preflight's estimate; with --longest, the preflight alone.
#include <fstream>
#include <iostream>
#include <memory>

#include "bench_part.h"
#include "memory_bench.h"

namespace mmsp::cli {

namespace {

void add_memory_flags(CLI::App& app, bench::MemoryBenchOptions& o) {
  app.add_option("--model", o.models, "model configs (repeatable)")->capture_default_str();
  app.add_option("--layers", o.scale.layers, "keep this many decoder layers (0: all)")->capture_default_str();
  app.add_option("--vision-layers", o.scale.vision_layers, "keep this many vision blocks (0: all)")
      ->capture_default_str();
  app.add_option("--vocab", o.scale.vocab,
                 "cut the vocabulary to this many words, special token ids moved to its top (0: as released)")
      ->capture_default_str();
  app.add_option("--tokens-per-rank", o.tokens_per_rank, "tokens per rank of a step")->capture_default_str();
  app.add_option("--loss-chunk", o.loss_chunk, "tokens per chunk in the chunked rows (0: default)")
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32 | bfloat16 | float64")->capture_default_str();
  app.add_option("--steps", o.steps, "steps per setting (the last is reported)")->capture_default_str();
  app.add_option("--shard", o.shards,
                 "only the rows of these --shard levels: none | optimizer | gradients | parameters (repeatable; "
                 "default every row)");
}

void add_row_flags(CLI::App& app, bench::MemoryBenchOptions& o, std::string& device) {
  app.add_option("--checkpoint-activations", o.checkpointing,
                 "only the rows of these modes: none | decoder | all (repeatable; default every row)");
  app.add_option("--device", device, "auto | cpu | cuda (rank_device.h)")->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "the card's dense peak, for MFU on CUDA")->capture_default_str();
  app.add_option("--attention-kernel", o.attention_kernel, "auto | blockwise | fused")->capture_default_str();
  app.add_option("--longest", o.longest_bytes,
                 "device capacities in bytes: no training, the most tokens per rank each holds by the "
                 "preflight's estimate, per row (repeatable)");
  app.add_option("--freeze", o.freeze, "every row with these parts frozen: vision, merger, llm, embeddings");
  app.add_option("--lora-rank", o.lora_rank, "every row with LoRA adapters of this rank (the decoder's projections)");
  app.add_option("--longest-ranks", o.longest_ranks,
                 "--longest: ranks the state is sharded over (default: this job's)");
  app.add_option("--expert", o.expert,
                 "expert-parallel degree (mixture-of-experts models): each block of this many ranks splits the "
                 "experts, sharded over their replicas under --shard")
      ->capture_default_str();
  app.add_option("--longest-ring", o.longest_ring,
                 "--longest: ranks of the context group's ring, the rest Ulysses (default: all one ring)");
}

// Each row on stderr as it ends, and --out rewritten, so a run cut short keeps its rows.
void report_row(const nlohmann::json& partial, const std::string& out) {
  const nlohmann::json& row = partial["rows"].back();
  std::cerr << "bench memory: row " << partial["rows"].size() << ": shard " << row["shard"].get<std::string>()
            << ", checkpoint " << row["checkpoint_activations"].get<std::string>() << ", loss chunk "
            << row["loss_chunk"].get<std::string>() << ", tiled MLP " << row["tiled_mlp"].get<std::string>()
            << (row["offload_activations"].get<bool>() ? ", offload" : "") << ": peak "
            << row["measured"]["step_peak_bytes"] << " B, step " << row["measured"]["step_seconds"] << " s"
            << std::endl;
  if (!out.empty()) std::ofstream(out) << partial.dump(2) << std::endl;
}

}  // namespace

void add_memory_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  struct Flags {
    bench::MemoryBenchOptions memory;
    std::string device = "auto";
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = bench.add_subcommand(
      "memory",
      "a training step's memory per rank under --shard, --checkpoint-activations and --loss-chunk, "
      "measured next to the preflight's estimate (run under mmsp-run -n 1, 2, 4)");
  add_memory_flags(*app, f->memory);
  add_out_flag(*app, out, "write the JSON here instead of stdout (rewritten after each row)");
  add_row_flags(*app, f->memory, f->device);
  parts.push_back({app, [f, &out](const dist::RankEnv& env) {
                     f->memory.on_row = [&out](const nlohmann::json& partial) { report_row(partial, out); };
                     const dist::RankDevice rank = bench_device(f->device, env);
                     f->memory.device = rank.device;
                     f->memory.gpu_collectives = rank.collectives;
                     return bench::bench_memory(env, f->memory);
                   }});
}

}  // namespace mmsp::cli
