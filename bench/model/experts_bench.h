// `mmsp bench experts`: one mixture-of-experts layer's token exchange over the expert
// group (every rank of the job, `--expert` = world), forward and backward, per routing: the
// bytes each rank sent, measured by the expert group's counters, against the formula
// twice over — the uniform one the preflight and docs/moe.md use
// (parallel::expert_exchange_bytes, forward and again backward, less the counts' second
// time) and the exact one from the rows this rank actually sent and received:
//   2 · (A_out + A_in) · h · b + 8 · (P − 1) · E / P
// (A_out rows to other ranks' experts, A_in rows from other ranks, each crossing once
// each way forward and again backward; the counts' all-to-all once). Routings: `uniform`
// (a random router: picks spread over the experts) and `skewed` (the router sends every
// token's k picks to rank 0's first k experts: the busiest rank receives every row). The
// layer is the model's own SparseMoeBlock (moe_block.h) at the config's shapes. Run under
// `mmsp-run -n 4`.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "mmsp/dist/rank_env.h"

namespace mmsp::bench {

struct ExpertsBenchOptions {
  std::string model = "configs/hf/Qwen3-VL-30B-A3B-Instruct.json";  // a MoE config: h, E, k, I
  int64_t tokens = 256;                                             // tokens per rank
  std::string dtype = "bfloat16";
};

// Every rank calls it; rank 0's result holds the rows.
nlohmann::json bench_experts(const dist::RankEnv& env, const ExpertsBenchOptions& options);

}  // namespace mmsp::bench
