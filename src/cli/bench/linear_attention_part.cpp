// `mmsp bench linear-attention`: the Gated DeltaNet kernel alone (chunked against the
// recurrence), and its bytes per layer under several ranks (Ulysses, state passing).
#include <memory>

#include "bench_part.h"
#include "linear_attention_bench.h"
#include "mmsp/core/check.h"

namespace mmsp::cli {

void add_linear_attention_bench(CLI::App& bench, std::string& out, BenchParts& parts) {
  struct Flags {
    bench::LinearAttentionBenchOptions linear;
    std::string device = "auto";
    std::string part = "auto";
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = bench.add_subcommand(
      "linear-attention", "Gated DeltaNet: chunked kernel vs recurrence; bytes per layer, Ulysses and state passing");
  app->add_option("--part", f->part, "kernel | comm; auto: kernel alone, comm under several ranks")
      ->check(CLI::IsMember({"auto", "kernel", "comm"}));
  app->add_option("--tokens", f->linear.tokens, "context-group sequence lengths (comm part)");
  app->add_option("--kernel-tokens", f->linear.kernel_tokens, "sequence length (kernel part)");
  app->add_option("--threads", f->linear.threads, "ATen threads");
  app->add_option("--device", f->device, "auto | cpu | cuda (kernel part)")->capture_default_str();
  add_out_flag(*app, out);
  parts.push_back({app, [f](const dist::RankEnv& env) {
                     nlohmann::json result;
                     const std::string part = f->part != "auto" ? f->part : env.world_size > 1 ? "comm" : "kernel";
                     if (part == "kernel") {
                       f->linear.device = bench_device(f->device, env).device;
                       result["kernel"] = bench::bench_linear_attention_kernel(f->linear);
                     }
                     if (part == "comm") {
                       MMSP_CHECK(env.world_size > 1,
                                  "the comm part needs several ranks: mmsp-run -n 4 -- mmsp bench linear-attention");
                       result["comm"] = bench::bench_linear_attention_comm(env, f->linear);
                     }
                     return result;
                   }});
}

}  // namespace mmsp::cli
