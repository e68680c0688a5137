// `mmsp bench placement`: zigzag against adaptive placement, PLANNED figures only (the
// planner's load report; nothing is sent): attention bytes per step (Ulysses all-to-alls +
// ring K/V, attention_cost.h), padding, attention-work and token max/mean, on three
// workloads at 2 to 64 context ranks, and the planning time of 1,000,000 tokens on 64.
// Torch-free: also built as the stand-alone bench_placement.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mmsp/plan/attention_cost.h"
#include "mmsp/plan/mesh.h"
#include "mmsp/plan/model_conventions.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::bench {

struct PlacementBenchOptions {
  std::vector<int> ranks = {2, 4, 8, 16, 32, 64};  // context group sizes (ring x ulysses)
  int64_t tokens_per_rank = 16384;                 // a step holds this many tokens per context rank
  int timing_repeats = 5;                          // median of this many plans for the timing
  plan::AttentionShape shape;
};

// Rows {workload, ranks, ring, ulysses, placement, bytes, padding, ...} and the timings.
nlohmann::json bench_placement(const PlacementBenchOptions& options);

// The three workloads of `tokens` tokens (seeded: the same batches on every rank and run).
struct PlacementWorkload {
  const char* name;  // "sft", "vlm", "long"
  plan::Batch batch;
};
std::vector<PlacementWorkload> placement_workloads(int64_t tokens, const plan::ModelConventions& conventions);

// Writes the text workloads (sft, long) of `tokens` tokens as DIR/sft.jsonl and
// DIR/long.jsonl (input_ids only: every token a target), for `mmsp train --data` to time a
// training step under each placement. Returns the files written.
std::vector<std::string> write_placement_data(const std::string& dir, int64_t tokens);

// The context group of `ranks`: Ulysses inside a node of up to 8, ring across.
plan::Mesh placement_mesh(int ranks);

// The rows as a Markdown table (docs/plan.md).
std::string placement_table(const nlohmann::json& result);

}  // namespace mmsp::bench
