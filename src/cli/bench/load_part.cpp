// `mmsp bench load`: a Hugging Face directory written, then loaded on every rank, against cat.
#include <memory>

#include "bench_part.h"
#include "load_bench.h"

namespace mmsp::cli {

void add_load_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  auto o = std::make_shared<bench::LoadBenchOptions>();
  CLI::App* app = bench.add_subcommand(
      "load",
      "write a sharded HF directory, load it on every rank into fp32 and bf16 params; time vs cat, peak memory");
  app->add_option("--bytes", o->bytes, "bytes of bf16 tensor data to write (default 1e9)");
  app->add_option("--shards", o->shards, "shard files (hub's plan with max_shard_bytes = bytes / shards)");
  app->add_option("--dir", o->dir, "directory to write (new or empty; kept); default: a temporary one");
  add_out_flag(*app, out);
  parts.push_back({app, [o](const dist::RankEnv& env) { return bench::bench_load(env, *o); }});
}

}  // namespace mmsp::cli
