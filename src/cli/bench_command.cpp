// `mmsp bench <part>`: gathers the parts, one file each in bench/ (attention,
// linear-attention, vision and step, vision-split, load, memory, placement, logprobs, experts), runs the
// one parsed and prints its JSON on rank 0 (or writes it to --out).
#include "bench_command.h"

#include <fstream>
#include <iostream>
#include <memory>

#include "bench/bench_part.h"

namespace mmsp::cli {

Subcommand add_bench_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand("bench", "benchmarks (JSON on stdout or --out)");
  app->require_subcommand(1);
  auto out = std::make_shared<std::string>();
  auto parts = std::make_shared<BenchParts>();
  for (auto add : {add_attention_bench, add_linear_attention_bench, add_vlm_bench, add_vision_split_bench,
                   add_load_bench, add_memory_bench, add_placement_bench, add_logprobs_bench, add_experts_bench})
    add(*app, *out, *parts);
  return {app, [out, parts]() {
            const dist::RankEnv env = dist::rank_env_from(dist::process_environment());
            nlohmann::json result;
            for (const BenchPart& part : *parts)
              if (part.app->parsed()) result = part.run(env);
            if (env.rank != 0) return 0;
            if (out->empty()) {
              std::cout << result.dump(2) << std::endl;
            } else {
              std::ofstream(*out) << result.dump(2) << std::endl;
            }
            return 0;
          }};
}

}  // namespace mmsp::cli
