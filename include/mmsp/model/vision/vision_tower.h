// What the one VLM step (vlm.h) asks of a family's vision tower (with its projector and
// whatever joins them: Qwen's merger and deepstack mergers, LLaVA's projector, InternVL's
// pixel shuffle and projector). The step owns the rules every family shares — a rank with
// no items stays in the routing graph and, when the blocks are hooked, runs them on the
// tower's empty input; the rows enter the vision phase — so a tower only says how to
// read its pixels and how to encode them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "mmsp/model/hooks/hooked_blocks.h"
#include "mmsp/model/vision/pixel_inputs.h"
#include "mmsp/model/vision/routed_rows.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::model {

// This rank's shard of the items split over the context group (vision-tower SP): each
// item's whole grid and row boundaries over the ranks (plan::VisionItem::shard_rows), and
// the exchange that lets the tower's attention see the whole items.
struct SplitShards {
  std::vector<plan::Grid> grids;
  std::vector<std::vector<int64_t>> shard_rows;
  std::vector<int64_t> patches_per_row;  // patches of one embedding row (Qwen: m²)
  int rank = 0;
  // this rank's pixel rows of them (Qwen: its patches; LLaVA: the split images whole), in
  // TowerInput::pixels after the whole items'
  int64_t pixel_rows = 0;
  SplitExchange exchange;
  bool empty() const { return grids.empty(); }
  // Starts this rank's shards (its rank and exchange); add() appends a split item.
  SplitShards() = default;
  explicit SplitShards(const SplitEncoding& split) : rank(split.rank), exchange(split.exchange) {}
  void add(const plan::VisionItem& item, int64_t per_row) {
    grids.push_back(item.grid);
    shard_rows.push_back(item.shard_rows);
    patches_per_row.push_back(per_row);
  }
  int ranks() const { return shard_rows.empty() ? 1 : static_cast<int>(shard_rows[0].size()) - 1; }
  // Patches [first, first + count) of split item j that context rank r encodes.
  int64_t first_patch(size_t j, int r) const { return shard_rows[j][r] * patches_per_row[j]; }
  int64_t patch_count(size_t j, int r) const { return (shard_rows[j][r + 1] - shard_rows[j][r]) * patches_per_row[j]; }
};

// A tower's input for some items: pixels in its layout and, where its encoder needs
// them (Qwen's rotary positions and windows), the items' grids; then this rank's shards
// of the split items, their pixels after the whole items'.
struct TowerInput {
  at::Tensor pixels;
  std::vector<plan::Grid> grids;
  SplitShards split;
};

class VisionTower {
 public:
  virtual ~VisionTower() = default;

  // The pixels of `items` (held here, PixelInputs) in item order. Errors name the item.
  virtual TowerInput gather(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels) const = 0;

  // Adds this rank's shard of the split `items` (vision-tower SP) to `input`: their pixels
  // after the whole items' and what encode() needs to attend over them whole. Towers that
  // cannot split refuse (the planner splits nothing for them: ModelConventions::vision_heads).
  virtual void add_split(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels,
                         const SplitEncoding& split, TowerInput& input) const;

  // The input of no items ([0, ...] in the tower's layout) a rank without items runs
  // through hooked blocks, so that it calls their hooks as the others do. Every tower
  // encodes it, hooked or not, to [0, row_width()] rows: no tower checks who asks.
  virtual TowerInput no_items(const at::TensorOptions& options) const = 0;

  // input -> rows [Σ rows, row_width()], one row per placeholder slot; a tower with
  // deepstack levels puts each level's row beside the main one (one message, one route).
  virtual at::Tensor encode(const TowerInput& input) const = 0;

  // The decoder's hidden size × (1 + deepstack_levels()).
  virtual int64_t row_width() const = 0;
  virtual int deepstack_levels() const { return 0; }

  // The blocks as hook units (hooked_blocks.h), in the order the tower runs them.
  virtual HookedBlocks& blocks() = 0;

  // Checks every rank makes alike before the step's first collective, over the whole
  // plan (every dp row's items), so that a bad batch fails everywhere. Default: none.
  virtual void check(const plan::StepPlan& plan, const PixelInputs& pixels) const {}
};

}  // namespace mmsp::model
