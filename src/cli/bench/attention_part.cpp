// `mmsp bench attention [--part kernel|balance|comm|all|fused|ring|choice]`: the kernel and
// balance parts run in one process; the comm and ring parts on every rank of the job
// (mmsp-run -n 2 or 4); fused: mmsp's local attention kernels against torch's SDPA backends;
// choice: --attention-kernel auto's measured choice.
#include <memory>

#include "attention_bench.h"
#include "bench_part.h"
#include "fused_attention_bench.h"
#include "kernel_choice_bench.h"
#include "mmsp/core/check.h"

namespace mmsp::cli {

namespace {

struct AttentionFlags {
  bench::AttentionBenchOptions attention;
  bench::FusedAttentionBenchOptions fused;
  std::string device = "auto";
  std::string part = "auto";
};

void add_kernel_flags(CLI::App& app, AttentionFlags& f) {
  app.add_option("--tokens", f.attention.tokens, "kernel benchmark sequence length");
  app.add_option("--heads", f.attention.heads, "query heads");
  app.add_option("--kv-heads", f.attention.kv_heads, "key/value heads");
  app.add_option("--dim", f.attention.dim, "head size");
  app.add_option("--block-q", f.attention.block_q, "kernel query block");
  app.add_option("--block-k", f.attention.block_k, "kernel key block");
  app.add_option("--threads", f.attention.threads, "ATen threads for mm and attention");
  app.add_option("--min-time", f.attention.min_time, "seconds per measurement");
  app.add_option("--comm-tokens", f.attention.comm_tokens, "context-group tokens (comm part)");
}

void add_fused_flags(CLI::App& app, AttentionFlags& f) {
  app.add_option("--device", f.device, "auto | cpu | cuda (the fused part)")->capture_default_str();
  app.add_option("--fused-tokens", f.fused.tokens, "fused part: causal sequence lengths")->capture_default_str();
  app.add_option("--segments", f.fused.segments, "fused part: packed segment lengths (cycled)")->capture_default_str();
  app.add_option("--dtype", f.fused.dtype, "fused part: bfloat16 | float16 | float32 | float64")->capture_default_str();
  app.add_option("--repeats", f.fused.repeats, "fused part: timed runs (median)")->capture_default_str();
  app.add_option("--attention-kernel", f.fused.kernel, "fused and ring parts: auto | fused | cudnn | blockwise")
      ->capture_default_str();
}

nlohmann::json run_attention(const CLI::App& app, AttentionFlags& f, const dist::RankEnv& env) {
  nlohmann::json result;
  const std::string part = f.part != "auto" ? f.part : env.world_size > 1 ? "comm" : "local";
  // The fused and ring parts' shapes are the (16 heads of 128) unless given.
  auto fused_shapes = [&] {
    if (app.get_option("--heads")->count() > 0) f.fused.heads = f.attention.heads;
    f.fused.kv_heads = app.get_option("--kv-heads")->count() > 0 ? f.attention.kv_heads : f.fused.heads;
    if (app.get_option("--dim")->count() > 0) f.fused.dim = f.attention.dim;
    return bench_device(f.device, env);
  };
  if (part == "fused") {
    f.fused.device = fused_shapes().device;
    result["fused"] = bench::bench_fused_attention(f.fused);
  }
  if (part == "choice") {
    f.fused.device = fused_shapes().device;
    result["choice"] = bench::bench_kernel_choice(f.fused);
  }
  if (part == "ring") {
    const dist::RankDevice rank = fused_shapes();
    f.fused.device = rank.device;
    result["ring"] = bench::bench_ring_attention(env, f.fused, rank.collectives);
  }
  if (part == "kernel" || part == "local" || part == "all")
    result["kernel"] = bench::bench_attention_kernel(f.attention);
  if (part == "balance" || part == "local" || part == "all")
    result["balance"] = bench::bench_attention_balance(f.attention);
  if (part == "comm" || part == "all") {
    MMSP_CHECK(env.world_size > 1, "the comm part needs several ranks: mmsp-run -n 4 -- mmsp bench attention");
    result["comm"] = bench::bench_attention_comm(env, f.attention);
  }
  return result;
}

}  // namespace

void add_attention_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  auto f = std::make_shared<AttentionFlags>();
  CLI::App* app = bench.add_subcommand(
      "attention", "local kernel vs torch::mm and naive; zigzag balance; bytes per layer per scheme");
  app->add_option("--part", f->part,
                  "kernel | balance | comm | all | fused; auto: kernel+balance alone, comm under several ranks; "
                  "fused: mmsp's local attention against torch's SDPA backends (--device cuda on a GPU); "
                  "ring: the zigzag ring over this job's ranks, communication overlapped and not, against one rank's "
                  "kernel on the whole sequence; choice: auto's measured choice (probe + timing of every kernel)")
      ->check(CLI::IsMember({"auto", "kernel", "balance", "comm", "all", "fused", "ring", "choice"}));
  add_kernel_flags(*app, *f);
  add_out_flag(*app, out);
  add_fused_flags(*app, *f);
  parts.push_back({app, [app, f](const dist::RankEnv& env) { return run_attention(*app, *f, env); }});
}

}  // namespace mmsp::cli
