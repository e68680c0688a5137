// `mmsp bench attention [--part kernel|balance|comm|all] [--out FILE]`. The kernel
// and balance parts run in one process; the comm part runs on every rank of the
// job (mmsp-run -n 2 or 4) and rank 0 writes the result. `mmsp bench linear-attention`
// likewise: the Gated DeltaNet kernel alone, its bytes per layer under several ranks.
// `mmsp bench vision` / `mmsp bench step`: peak memory and bytes of the VLM's vision
// part / whole step in the three vision modes on 1, 2 and 4 ranks (mmsp-run -n 4);
// `mmsp bench vision-split`: one large item on one rank, by Vision DP, and split.
// `mmsp bench load`: a Hugging Face directory loaded on every rank, against cat.
// `mmsp bench memory`: a training step's memory per rank under the memory flags.
// `mmsp bench placement`: zigzag vs adaptive placement, planned figures (one process);
// with --measure, under mmsp-run, the attention itself, bytes counted and timed.
#include "bench_command.h"

#include <fstream>
#include <iostream>
#include <memory>

#include "attention_bench.h"
#include "fused_attention_bench.h"
#include "linear_attention_bench.h"
#include "load_bench.h"
#include "mesh_options.h"
#include "memory_bench.h"
#include "placement_bench.h"
#include "placement_measure.h"
#include "vision_split_bench.h"
#include "vlm_bench.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/rank_device.h"

namespace mmsp::cli {

Subcommand add_bench_command(CLI::App& parent) {
  struct Flags {
    bench::AttentionBenchOptions attention;
    bench::FusedAttentionBenchOptions fused;
    std::string device = "auto";
    bench::LinearAttentionBenchOptions linear;
    bench::VlmBenchOptions vlm;
    bench::VisionSplitBenchOptions vision_split;
    bench::LoadBenchOptions load;
    bench::MemoryBenchOptions memory;
    bench::PlacementBenchOptions placement;
    bench::PlacementMeasureOptions placement_measure;
    bool measure = false;
    std::string placement_data;
    std::string part = "auto";
    std::string out;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = parent.add_subcommand("bench", "benchmarks (JSON on stdout or --out)");
  app->require_subcommand(1);
  CLI::App* attn = app->add_subcommand(
      "attention", "local kernel vs torch::mm and naive; zigzag balance; bytes per layer per scheme");
  attn->add_option("--part", flags->part,
                   "kernel | balance | comm | all | fused; auto: kernel+balance alone, comm under several ranks; "
                   "fused: mmsp's local attention against torch's SDPA backends (--device cuda on a GPU); "
                   "ring: the zigzag ring over this job's ranks against one rank's kernel on the whole sequence")
      ->check(CLI::IsMember({"auto", "kernel", "balance", "comm", "all", "fused", "ring"}));
  attn->add_option("--tokens", flags->attention.tokens, "kernel benchmark sequence length");
  attn->add_option("--heads", flags->attention.heads, "query heads");
  attn->add_option("--kv-heads", flags->attention.kv_heads, "key/value heads");
  attn->add_option("--dim", flags->attention.dim, "head size");
  attn->add_option("--block-q", flags->attention.block_q, "kernel query block");
  attn->add_option("--block-k", flags->attention.block_k, "kernel key block");
  attn->add_option("--threads", flags->attention.threads, "ATen threads for mm and attention");
  attn->add_option("--min-time", flags->attention.min_time, "seconds per measurement");
  attn->add_option("--comm-tokens", flags->attention.comm_tokens, "context-group tokens (comm part)");
  attn->add_option("--out", flags->out, "write the JSON here instead of stdout");
  attn->add_option("--device", flags->device, "auto | cpu | cuda (the fused part)")->capture_default_str();
  attn->add_option("--fused-tokens", flags->fused.tokens, "fused part: causal sequence lengths")->capture_default_str();
  attn->add_option("--segments", flags->fused.segments, "fused part: packed segment lengths (cycled)")
      ->capture_default_str();
  attn->add_option("--dtype", flags->fused.dtype, "fused part: bfloat16 | float16 | float32 | float64")
      ->capture_default_str();
  attn->add_option("--repeats", flags->fused.repeats, "fused part: timed runs (median)")->capture_default_str();
  attn->add_option("--attention-kernel", flags->fused.kernel, "fused part: auto | blockwise | fused")
      ->capture_default_str();
  CLI::App* lin = app->add_subcommand(
      "linear-attention", "Gated DeltaNet: chunked kernel vs recurrence; bytes per layer, Ulysses and state passing");
  lin->add_option("--part", flags->part, "kernel | comm; auto: kernel alone, comm under several ranks")
      ->check(CLI::IsMember({"auto", "kernel", "comm"}));
  lin->add_option("--tokens", flags->linear.tokens, "context-group sequence lengths (comm part)");
  lin->add_option("--kernel-tokens", flags->linear.kernel_tokens, "sequence length (kernel part)");
  lin->add_option("--threads", flags->linear.threads, "ATen threads");
  lin->add_option("--device", flags->device, "auto | cpu | cuda (kernel part)")->capture_default_str();
  lin->add_option("--out", flags->out, "write the JSON here instead of stdout");
  CLI::App* vision = app->add_subcommand(
      "vision", "VLM vision part: peak memory per rank and bytes, routed vs gather vs replicate, 1/2/4 ranks");
  CLI::App* step = app->add_subcommand(
      "step", "whole VLM training step: peak memory per rank and bytes, three vision modes, 1/2/4 ranks");
  for (CLI::App* sub : {vision, step}) {
    sub->add_option("--images", flags->vlm.images, "images in the batch (one per sequence)");
    sub->add_option("--image-side", flags->vlm.image_side, "patches per image side (even)");
    sub->add_option("--model", flags->vlm.model,
                    "config.json of any supported model_type (default: the built-in Qwen2-VL of docs/model.md)");
    sub->add_option("--image-width", flags->vlm.image_width, "--model: image width in pixels");
    sub->add_option("--image-height", flags->vlm.image_height, "--model: image height in pixels");
    sub->add_option("--repeats", flags->vlm.repeats, "runs of each row; seconds are the fastest run's")
        ->capture_default_str();
    sub->add_option("--out", flags->out, "write the JSON here instead of stdout");
  }
  CLI::App* vision_split = app->add_subcommand(
      "vision-split", "vision-tower SP: one large item encoded on one rank, by Vision DP, and split over the ranks: "
                      "peak memory, bytes against the formula, seconds (run under mmsp-run -n 4)");
  vision_split->add_option("--patches", flags->vision_split.patches,
                           "item sizes in patches (square images up to 128², else videos of 64 × 64 frames)")
      ->capture_default_str();
  vision_split->add_option("--small-items", flags->vision_split.small_items,
                           "small 32 × 32 images beside the first item in the planned mixed batch")
      ->capture_default_str();
  vision_split->add_option("--repeats", flags->vision_split.repeats, "runs of each row; seconds are the fastest run's")
      ->capture_default_str();
  vision_split->add_option("--out", flags->out, "write the JSON here instead of stdout");
  CLI::App* load = app->add_subcommand(
      "load", "write a sharded HF directory, load it on every rank into fp32 and bf16 params; time vs cat, peak memory");
  load->add_option("--bytes", flags->load.bytes, "bytes of bf16 tensor data to write (default 1e9)");
  load->add_option("--shards", flags->load.shards, "shard files (hub's plan with max_shard_bytes = bytes / shards)");
  load->add_option("--dir", flags->load.dir, "directory to write (new or empty; kept); default: a temporary one");
  load->add_option("--out", flags->out, "write the JSON here instead of stdout");
  CLI::App* memory = app->add_subcommand(
      "memory", "a training step's memory per rank under --shard, --checkpoint-activations and --loss-chunk, "
                "measured next to the preflight's estimate (run under mmsp-run -n 1, 2, 4)");
  memory->add_option("--model", flags->memory.models, "model configs (repeatable)")->capture_default_str();
  memory->add_option("--layers", flags->memory.scale.layers, "keep this many decoder layers (0: all)")
      ->capture_default_str();
  memory->add_option("--vision-layers", flags->memory.scale.vision_layers, "keep this many vision blocks (0: all)")
      ->capture_default_str();
  memory->add_option("--vocab", flags->memory.scale.vocab,
                     "cut the vocabulary to this many words, special token ids moved to its top (0: as released)")
      ->capture_default_str();
  memory->add_option("--tokens-per-rank", flags->memory.tokens_per_rank, "tokens per rank of a step")
      ->capture_default_str();
  memory->add_option("--loss-chunk", flags->memory.loss_chunk, "tokens per chunk in the chunked rows (0: default)")
      ->capture_default_str();
  memory->add_option("--dtype", flags->memory.dtype, "float32 | bfloat16 | float64")->capture_default_str();
  memory->add_option("--steps", flags->memory.steps, "steps per setting (the last is reported)")->capture_default_str();
  memory->add_option("--shard", flags->memory.shards,
                     "only the rows of these --shard levels: none | optimizer | gradients | parameters (repeatable; "
                     "default every row)");
  memory->add_option("--out", flags->out, "write the JSON here instead of stdout (rewritten after each row)");
  memory->add_option("--checkpoint-activations", flags->memory.checkpointing,
                     "only the rows of these modes: none | decoder | all (repeatable; default every row)");
  memory->add_option("--device", flags->device, "auto | cpu | cuda (rank_device.h)")->capture_default_str();
  memory->add_option("--peak-tflops", flags->memory.peak_tflops, "the card's dense peak, for MFU on CUDA")
      ->capture_default_str();
  memory->add_option("--attention-kernel", flags->memory.attention_kernel, "auto | blockwise | fused")
      ->capture_default_str();
  memory->add_option("--longest", flags->memory.longest_bytes,
                     "device capacities in bytes: no training, the most tokens per rank each holds by the "
                     "preflight's estimate, per row (repeatable)");
  memory->add_option("--longest-ranks", flags->memory.longest_ranks,
                     "--longest: ranks the state is sharded over (default: this job's)");
  CLI::App* placement = app->add_subcommand(
      "placement", "zigzag vs adaptive placement, planned: attention bytes, padding, work and token max/mean on "
                   "three workloads at 2..64 ranks; planning time of 1,000,000 tokens on 64");
  placement->add_option("--ranks", flags->placement.ranks, "context group sizes")->capture_default_str();
  placement->add_option("--tokens-per-rank", flags->placement.tokens_per_rank, "tokens per context rank of a step")
      ->capture_default_str();
  placement->add_option("--heads", flags->placement.shape.heads, "query heads")->capture_default_str();
  placement->add_option("--kv-heads", flags->placement.shape.kv_heads, "key/value heads")->capture_default_str();
  placement->add_option("--head-dim", flags->placement.shape.head_dim, "head size")->capture_default_str();
  placement->add_option("--element-bytes", flags->placement.shape.element_bytes, "bytes per element")
      ->capture_default_str();
  placement->add_option("--layers", flags->placement.shape.layers, "attention layers")->capture_default_str();
  placement->add_flag("--measure", flags->measure,
                      "under mmsp-run -n 2|4: run the attention of each workload's step on this job's ranks, "
                      "bytes counted and timed (fp32; --tokens-per-rank, --heads .. --layers as given, "
                      "their defaults then 4096 tokens, 8/2 heads of 64, 4 layers)");
  placement->add_option("--write-data", flags->placement_data,
                        "write the text workloads of --tokens-per-rank x 2 tokens as DIR/sft.jsonl and "
                        "DIR/long.jsonl (for mmsp train --data) and stop");
  placement->add_option("--repeats", flags->placement_measure.repeats, "--measure: runs per row (median)")
      ->capture_default_str();
  placement->add_option("--out", flags->out, "write the JSON here instead of stdout");
  return {app, [flags, attn, lin, vision, step, vision_split, load, memory, placement]() {
            const dist::RankEnv env = dist::rank_env_from(dist::process_environment());
            std::string part = flags->part;
            nlohmann::json result;
            if (placement->parsed() && !flags->placement_data.empty()) {
              result["written"] = bench::write_placement_data(flags->placement_data, 2 * flags->placement.tokens_per_rank);
            } else if (placement->parsed() && flags->measure) {
              bench::PlacementMeasureOptions& m = flags->placement_measure;
              auto given = [&](const char* flag) { return placement->count(flag) > 0; };
              if (given("--tokens-per-rank")) m.tokens_per_rank = flags->placement.tokens_per_rank;
              if (given("--heads")) m.shape.heads = flags->placement.shape.heads;
              if (given("--kv-heads")) m.shape.kv_heads = flags->placement.shape.kv_heads;
              if (given("--head-dim")) m.shape.head_dim = flags->placement.shape.head_dim;
              if (given("--element-bytes")) m.shape.element_bytes = flags->placement.shape.element_bytes;
              if (given("--layers")) m.shape.layers = flags->placement.shape.layers;
              result = bench::measure_placement(env, m);
            } else if (placement->parsed()) {
              result = bench::bench_placement(flags->placement);
            } else if (load->parsed()) {
              result = bench::bench_load(env, flags->load);
            } else if (memory->parsed()) {
              flags->memory.on_row = [out = flags->out](const nlohmann::json& partial) {
                const nlohmann::json& row = partial["rows"].back();
                std::cerr << "bench memory: row " << partial["rows"].size() << ": shard " << row["shard"].get<std::string>()
                          << ", checkpoint " << row["checkpoint_activations"].get<std::string>() << ", loss chunk "
                          << row["loss_chunk"].get<std::string>() << ", tiled MLP "
                          << row["tiled_mlp"].get<std::string>() << (row["offload_activations"].get<bool>() ? ", offload" : "")
                          << ": peak " << row["measured"]["step_peak_bytes"]
                          << " B, step " << row["measured"]["step_seconds"] << " s" << std::endl;
                if (!out.empty()) std::ofstream(out) << partial.dump(2) << std::endl;
              };
              const dist::RankDevice rank = dist::use_rank_device(dist::parse_device_request(flags->device), env,
                                                                  MeshFlags::device_env());
              flags->memory.device = rank.device;
              flags->memory.gpu_collectives = rank.collectives;
              result = bench::bench_memory(env, flags->memory);
            } else if (vision_split->parsed()) {
              result = bench::bench_vision_split(env, flags->vision_split);
            } else if (vision->parsed() || step->parsed()) {
              flags->vlm.step = step->parsed();
              result = bench::bench_vlm(env, flags->vlm);
            } else if (lin->parsed()) {
              if (part == "auto") part = env.world_size > 1 ? "comm" : "kernel";
              if (part == "kernel") {
                flags->linear.device =
                    dist::use_rank_device(dist::parse_device_request(flags->device), env, MeshFlags::device_env())
                        .device;
                result["kernel"] = bench::bench_linear_attention_kernel(flags->linear);
              }
              if (part == "comm") {
                MMSP_CHECK(env.world_size > 1, "the comm part needs several ranks: mmsp-run -n 4 -- mmsp bench linear-attention");
                result["comm"] = bench::bench_linear_attention_comm(env, flags->linear);
              }
            } else {
              if (part == "auto") part = env.world_size > 1 ? "comm" : "local";
              // The fused and ring parts' shapes are the (16 heads of 128) unless given.
              auto fused_shapes = [&] {
                if (attn->get_option("--heads")->count() > 0) flags->fused.heads = flags->attention.heads;
                flags->fused.kv_heads = attn->get_option("--kv-heads")->count() > 0 ? flags->attention.kv_heads
                                                                                      : flags->fused.heads;
                if (attn->get_option("--dim")->count() > 0) flags->fused.dim = flags->attention.dim;
                return dist::use_rank_device(dist::parse_device_request(flags->device), env,
                                             MeshFlags::device_env());
              };
              if (part == "fused") {
                flags->fused.device = fused_shapes().device;
                result["fused"] = bench::bench_fused_attention(flags->fused);
              }
              if (part == "ring") {
                const dist::RankDevice rank = fused_shapes();
                flags->fused.device = rank.device;
                result["ring"] = bench::bench_ring_attention(env, flags->fused, rank.collectives);
              }
              if (part == "kernel" || part == "local" || part == "all")
                result["kernel"] = bench::bench_attention_kernel(flags->attention);
              if (part == "balance" || part == "local" || part == "all")
                result["balance"] = bench::bench_attention_balance(flags->attention);
              if (part == "comm" || part == "all") {
                MMSP_CHECK(env.world_size > 1, "the comm part needs several ranks: mmsp-run -n 4 -- mmsp bench attention");
                result["comm"] = bench::bench_attention_comm(env, flags->attention);
              }
            }
            if (env.rank != 0) return 0;
            if (flags->out.empty()) {
              std::cout << result.dump(2) << std::endl;
            } else {
              std::ofstream(flags->out) << result.dump(2) << std::endl;
            }
            return 0;
          }};
}

}  // namespace mmsp::cli
