// `mmsp bench experts`: one mixture-of-experts layer's all-to-all bytes per rank, measured
// against the uniform and the exact formula (bench/model/experts_bench.h).
#include <memory>

#include "bench_part.h"
#include "experts_bench.h"

namespace mmsp::cli {

void add_experts_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  auto o = std::make_shared<bench::ExpertsBenchOptions>();
  CLI::App* app = bench.add_subcommand(
      "experts",
      "one mixture-of-experts layer's token exchange over every rank (expert parallelism), forward and backward: "
      "the bytes each rank sent against the formula, with uniform and skewed routing (mmsp-run -n 4)");
  app->add_option("--model", o->model, "a mixture-of-experts config: its hidden size, experts and top k")
      ->capture_default_str();
  app->add_option("--tokens", o->tokens, "tokens per rank")->capture_default_str();
  app->add_option("--dtype", o->dtype, "the layer's dtype: float32 | bfloat16 | float64")->capture_default_str();
  add_out_flag(*app, out);
  parts.push_back({app, [o](const dist::RankEnv& env) { return bench::bench_experts(env, *o); }});
}

}  // namespace mmsp::cli
