// `mmsp bench vision-split`: vision-tower SP (plan/vision_split.h) measured. For one item
// of each size on the world's ranks as one context group: the vision part's (forward +
// backward) peak tensor memory on the busiest rank, encoded on one rank (context 1), by
// Vision DP whole on one rank of the group (--vision-split off), and split over the
// group; the bytes each rank sends next to the formula; the seconds. And the planner's
// figure for a mixed batch (one giant item and many small ones): the busiest rank's
// encoder cost ÷ the mean, whole vs split. Run under `mmsp-run -n 4`.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "mmsp/dist/rank_env.h"

namespace mmsp::bench {

struct VisionSplitBenchOptions {
  // Items to measure, in patches: a square image up to 16,384 (128 × 128); larger ones as a
  // video of 64 × 64-patch temporal patches (Qwen2-VL attends within each).
  std::vector<int64_t> patches = {16384, 65536};
  int repeats = 1;  // runs of each row; its seconds are the fastest run's
  // the mixed batch: one item of patches[0] and this many 32 × 32-patch images
  int small_items = 24;
};

// Every rank calls it; rank 0's result holds the table.
nlohmann::json bench_vision_split(const dist::RankEnv& env, const VisionSplitBenchOptions& options);

}  // namespace mmsp::bench
