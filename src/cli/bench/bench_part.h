// One `mmsp bench <part>` subcommand: its flags on the `bench` app and the function
// that runs it on this rank, returning the JSON that rank 0 prints (or writes to --out).
// Each part is one file here; bench_command.cpp only gathers them.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mesh_options.h"
#include "mmsp/dist/rank_device.h"
#include "mmsp/dist/rank_env.h"

namespace mmsp::cli {

struct BenchPart {
  CLI::App* app = nullptr;
  std::function<nlohmann::json(const dist::RankEnv&)> run;
};

using BenchParts = std::vector<BenchPart>;

// --out, which every part has: the JSON goes to this file instead of stdout.
inline void add_out_flag(CLI::App& app, std::string& out, const char* what = "write the JSON here instead of stdout") {
  app.add_option("--out", out, what);
}

// The part's --device made this rank's device (as the train command does).
inline dist::RankDevice bench_device(const std::string& device, const dist::RankEnv& env) {
  return dist::use_rank_device(dist::parse_device_request(device), env, MeshFlags::device_env());
}

void add_attention_bench(CLI::App& bench, std::string& out, BenchParts& parts);
void add_linear_attention_bench(CLI::App& bench, std::string& out, BenchParts& parts);
void add_vlm_bench(CLI::App& bench, std::string& out, BenchParts& parts);  // vision and step
void add_vision_split_bench(CLI::App& bench, std::string& out, BenchParts& parts);
void add_load_bench(CLI::App& bench, std::string& out, BenchParts& parts);
void add_memory_bench(CLI::App& bench, std::string& out, BenchParts& parts);
void add_placement_bench(CLI::App& bench, std::string& out, BenchParts& parts);
void add_logprobs_bench(CLI::App& bench, std::string& out, BenchParts& parts);
void add_experts_bench(CLI::App& bench, std::string& out, BenchParts& parts);

}  // namespace mmsp::cli
