// `mmsp bench placement`: zigzag vs adaptive placement, planned figures (one process);
// with --measure, under mmsp-run, the attention itself, bytes counted and timed; with
// --write-data, the text workloads as JSON lines for mmsp train.
#include <memory>

#include "bench_part.h"
#include "placement_bench.h"
#include "placement_measure.h"

namespace mmsp::cli {

namespace {

struct PlacementFlags {
  bench::PlacementBenchOptions placement;
  bench::PlacementMeasureOptions measure_options;
  bool measure = false;
  std::string data;
};

void add_shape_flags(CLI::App& app, PlacementFlags& f) {
  app.add_option("--ranks", f.placement.ranks, "context group sizes")->capture_default_str();
  app.add_option("--tokens-per-rank", f.placement.tokens_per_rank, "tokens per context rank of a step")
      ->capture_default_str();
  app.add_option("--heads", f.placement.shape.heads, "query heads")->capture_default_str();
  app.add_option("--kv-heads", f.placement.shape.kv_heads, "key/value heads")->capture_default_str();
  app.add_option("--head-dim", f.placement.shape.head_dim, "head size")->capture_default_str();
  app.add_option("--element-bytes", f.placement.shape.element_bytes, "bytes per element")->capture_default_str();
  app.add_option("--layers", f.placement.shape.layers, "attention layers")->capture_default_str();
}

// --measure has its own defaults; the shape flags given override them.
nlohmann::json run_measure(const CLI::App& app, PlacementFlags& f, const dist::RankEnv& env) {
  bench::PlacementMeasureOptions& m = f.measure_options;
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  if (given("--tokens-per-rank")) m.tokens_per_rank = f.placement.tokens_per_rank;
  if (given("--heads")) m.shape.heads = f.placement.shape.heads;
  if (given("--kv-heads")) m.shape.kv_heads = f.placement.shape.kv_heads;
  if (given("--head-dim")) m.shape.head_dim = f.placement.shape.head_dim;
  if (given("--element-bytes")) m.shape.element_bytes = f.placement.shape.element_bytes;
  if (given("--layers")) m.shape.layers = f.placement.shape.layers;
  return bench::measure_placement(env, m);
}

}  // namespace

void add_placement_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  auto f = std::make_shared<PlacementFlags>();
  CLI::App* app = bench.add_subcommand(
      "placement",
      "zigzag vs adaptive placement, planned: attention bytes, padding, work and token max/mean on "
      "three workloads at 2..64 ranks; planning time of 1,000,000 tokens on 64");
  add_shape_flags(*app, *f);
  app->add_flag("--measure", f->measure,
                "under mmsp-run -n 2|4: run the attention of each workload's step on this job's ranks, "
                "bytes counted and timed (fp32; --tokens-per-rank, --heads .. --layers as given, "
                "their defaults then 4096 tokens, 8/2 heads of 64, 4 layers)");
  app->add_option("--write-data", f->data,
                  "write the text workloads of --tokens-per-rank x 2 tokens as DIR/sft.jsonl and "
                  "DIR/long.jsonl (for mmsp train --data) and stop");
  app->add_option("--repeats", f->measure_options.repeats, "--measure: runs per row (median)")->capture_default_str();
  add_out_flag(*app, out);
  parts.push_back({app, [app, f](const dist::RankEnv& env) {
                     if (!f->data.empty()) {
                       nlohmann::json result;
                       result["written"] = bench::write_placement_data(f->data, 2 * f->placement.tokens_per_rank);
                       return result;
                     }
                     if (f->measure) return run_measure(*app, *f, env);
                     return bench::bench_placement(f->placement);
                   }});
}

}  // namespace mmsp::cli
