// `mmsp bench placement --measure` under `mmsp-run -n N`: zigzag against adaptive on this
// job's N ranks (one context group, R x U as placement_mesh(N)), MEASURED: each workload's
// step is planned on every rank, then the decoder's attention (plan_step_attention and
// attention_function, as the model runs it) goes forward and backward `layers` times on
// random q, k, v of the rank's slots. Bytes come from the ring and ulysses groups' counters,
// next to the plan's load report; time is the slowest rank's (median of --repeats).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

#include "mmsp/dist/rank_env.h"
#include "mmsp/plan/attention_cost.h"

namespace mmsp::bench {

struct PlacementMeasureOptions {
  int64_t tokens_per_rank = 4096;
  // fp32 (element_bytes 4: the dtype the tensors are made in); a small decoder so that the
  // 2-core machine runs all three workloads in a minute
  plan::AttentionShape shape{8, 2, 64, 4, 4};
  int repeats = 3;
  int threads = 1;  // ATen threads per rank
};

// Every rank calls it; rank 0's result holds the rows.
nlohmann::json measure_placement(const dist::RankEnv& env, const PlacementMeasureOptions& options);

}  // namespace mmsp::bench
