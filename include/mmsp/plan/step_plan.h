// StepPlan: everything about a training step that is index arithmetic, computed from
// the batch metadata alone, identically on every rank, without communication. The
// common part is cheap for the whole batch; per-rank slots are built for one rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mmsp/plan/attention_cost.h"
#include "mmsp/plan/labels.h"
#include "mmsp/plan/mesh.h"
#include "mmsp/plan/model_conventions.h"
#include "mmsp/plan/mrope_positions.h"
#include "mmsp/plan/packing.h"
#include "mmsp/plan/placement.h"
#include "mmsp/plan/sequence.h"
#include "mmsp/plan/shard_map.h"
#include "mmsp/plan/vision_assignment.h"
#include "mmsp/plan/vision_routes.h"
#include "mmsp/plan/vision_split.h"

namespace mmsp::plan {

struct PlanOptions {
  Mesh mesh;
  Layout layout = Layout::zigzag;
  Placement placement = Placement::zigzag;  // adaptive needs layout zigzag
  PlacementOptions placement_balance;
  VisionCostModel vision_cost;
  VisionSplitOptions vision_split;  // vision-tower SP: off unless asked (the CLI asks auto)
  AttentionShape attention_shape;   // for the load report's planned bytes only
};

// Work per context rank of one dp row; ratios are max / mean over the group.
struct LoadReport {
  std::vector<int64_t> tokens;   // real tokens held
  std::vector<int64_t> padding;  // slots holding no real token (local_length - tokens)
  // causal attention (query, key) pairs it computes: of split segments, its ring rank's
  // queries against their segments' earlier keys divided by U (ulysses splits the heads); of
  // the segments it holds whole, all of them (they stay home for every head)
  std::vector<double> pairs;
  // planned attention bytes per step (attention_cost.h): Ulysses all-to-alls of the slots it
  // exchanges and ring K/V of its ring rank's share; zigzag exchanges every slot, adaptive
  // only split segments' (all-to-all-v, and a ring that carries only split K/V)
  std::vector<double> ulysses_bytes, ring_bytes;
  int64_t whole_segments = 0, split_segments = 0;
  std::vector<double> vision_cost;         // Vision DP (ours), split items' shares included
  int64_t split_items = 0;                 // items encoded by the whole context group
  std::vector<double> greedy_vision_cost;  // greedy contiguous rule, same cost model
  double tokens_ratio = 1.0, pairs_ratio = 1.0, vision_ratio = 1.0, greedy_vision_ratio = 1.0;
  int64_t padding_total() const;
  double attention_bytes_total() const;  // every rank's Ulysses + ring bytes
};

// One dp rank's packed row and its context group's shared decisions.
struct RowPlan {
  int dp = 0;
  PackedRow packing;
  ShardMap shards;
  std::vector<VisionItem> items;  // in packed order
  std::vector<FlatPiece> pieces;  // placeholder pieces in packed order
  std::vector<int> greedy_rank;   // the Python patches' assignment, for comparison
  bool used_greedy_fallback = false;
  // Items the --vision-split rule picked that cannot be split, and why (vision_split.h):
  // "image 3 (batch index): <reason>". They are planned whole.
  std::vector<std::string> vision_kept_whole;
  LoadReport load;
};

// The slots of one rank. L = local_length of its row; ranks in routes are context ranks.
struct RankPlan {
  int rank = 0;
  RankCoords coords;
  int64_t local_length = 0;
  std::vector<int64_t> tokens;         // [L] packed index, -1 for padding
  std::vector<int32_t> segment_ids;    // [L] segment of the row, -1 for tail padding
  std::vector<int64_t> segment_index;  // [L] order within the padded segment, -1 for tail padding
  int position_rows = 1;               // 3 (mRoPE) or 1
  std::vector<int64_t> positions;      // [position_rows, L]
  std::vector<int64_t> labels;         // [L]
  RankRoutes routes;
};

struct StepPlan {
  PlanOptions options;
  ModelConventions conventions;
  std::vector<ParsedSequence> sequences;  // per batch sequence
  std::vector<SequencePositions> positions;
  std::vector<int64_t> rope_deltas;  // per batch sequence
  std::vector<int> dp_of_sequence;
  std::vector<RowPlan> rows;  // per dp rank
  int64_t label_count = 0;    // labels not ignored, whole batch (loss normaliser)
  RankPlan mine;              // the rank asked for
};

// Validates everything (errors name the sequence and value) and plans `rank`.
StepPlan make_step_plan(const Batch& batch, const ModelConventions& conventions, const PlanOptions& options, int rank);

// The slots of any other rank of the same step (tests, `mmsp plan`).
RankPlan make_rank_plan(const Batch& batch, const StepPlan& plan, int rank);

// position_ids of a whole packed row: [rows, row length], padding = kPadPosition.
std::vector<int64_t> row_position_ids(const StepPlan& plan, int dp);

}  // namespace mmsp::plan
