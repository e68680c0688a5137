// Vision DP: every image and video is encoded whole by exactly one rank of its context
// group. Ours balances an estimated encoder cost; the greedy contiguous rule of the
// Python Vision DP patches (by patch count) is kept for comparison.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "mmsp/plan/sequence.h"

namespace mmsp::plan {

struct VisionCostModel {
  // Attention cost per frame relative to its linear layers: 4*(hw)^2*D vs 24*hw*D^2 FLOPs,
  // so (hw)^2 / (6 D); D = 1280 for the Qwen2-VL ViT.
  double attention_weight = 1.0 / 7680.0;
  // Costs within this fraction of the item's own cost count as tied (then locality decides).
  double tie_tolerance = 0.05;
};

// patches + attention_weight * t * (h*w)^2 for a grid in patches (frames encode separately).
double encoder_cost(const Grid& grid, const VisionCostModel& model);

struct VisionAssignment {
  std::vector<int> rank_of_item;      // context rank encoding each item
  std::vector<double> load;           // summed cost per rank
  double max_over_mean = 1.0;         // 1.0 when there is no load
  bool used_greedy_fallback = false;  // the contiguous rule was better on these inputs
};

// Largest cost first to the least-loaded rank; near ties go to preferred_rank[item]
// (the rank holding most of its tokens); then moves and swaps off the most loaded rank,
// and swaps of near-equal items that bring them home without raising the largest load.
// Never worse (max load) than assign_greedy_contiguous on the same inputs.
VisionAssignment assign_vision_balanced(const std::vector<double>& costs, const std::vector<int64_t>& patch_counts,
                                        const std::vector<int>& preferred_rank, int ranks,
                                        const VisionCostModel& model);

// Placeholder rows of one item on each context rank that holds any: (rank, rows).
using HeldRows = std::vector<std::pair<int, int64_t>>;

// Locality pass: moves items, or swaps near-equal ones (within tie_tolerance), so that
// more placeholder rows sit on the rank that encodes them — fewer rows to route —
// without ever raising the largest load. Updates `a` (ranks, loads, max/mean).
void keep_rows_home(VisionAssignment& a, const std::vector<double>& costs, const std::vector<HeldRows>& held, int ranks,
                    const VisionCostModel& model);

// The Python patches' rule (verl#5230, ROLL, AReaL): items stay in order; rank r takes
// items until its patch load reaches (remaining patches / remaining ranks), leaving at
// least one item per remaining rank.
std::vector<int> assign_greedy_contiguous(const std::vector<int64_t>& patch_counts, int ranks);

// The patches a rank encodes go through one vision-encoder call whose cu_seqlens are
// int32: checks each rank's total (message names the dp row, rank and total).
void check_encoder_patches(const std::vector<int64_t>& patch_counts, const std::vector<int>& rank_of_item, int ranks,
                           int dp);

// Loads and max/mean of any assignment under the given costs.
VisionAssignment evaluate_assignment(const std::vector<int>& rank_of_item, const std::vector<double>& costs, int ranks);
double max_over_mean(const std::vector<double>& values);

}  // namespace mmsp::plan
