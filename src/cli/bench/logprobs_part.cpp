// `mmsp bench logprobs`: per-token log-probabilities of one long sample, mmsp's way
// against the local-logits and naive (gathered logits) ways (bench/model/logprobs_bench.h).
#include <memory>

#include "bench_part.h"
#include "logprobs_bench.h"

namespace mmsp::cli {

void add_logprobs_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  auto o = std::make_shared<bench::LogprobsBenchOptions>();
  CLI::App* app = bench.add_subcommand(
      "logprobs",
      "per-token log-probs of one long sample over the ranks: mmsp's blocks and one all-reduce of T values, "
      "against local [T/P, V] logits and against gathering the logits (peak, bytes, seconds; mmsp-run -n 4)");
  app->add_option("--model", o->model, "a config: its hidden size and vocabulary")->capture_default_str();
  app->add_option("--vocab", o->vocab, "the vocabulary (0: the model's)")->capture_default_str();
  app->add_option("--tokens", o->tokens, "the sample's tokens (a multiple of the ranks)")->capture_default_str();
  app->add_option("--loss-chunk", o->loss_chunk, "mmsp's blocks, in tokens' worth of logits (0: the default)")
      ->capture_default_str();
  add_out_flag(*app, out);
  parts.push_back({app, [o](const dist::RankEnv& env) { return bench::bench_logprobs(env, *o); }});
}

}  // namespace mmsp::cli
