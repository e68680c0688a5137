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

#include "mmsp/model/hooked_blocks.h"
#include "mmsp/model/pixel_inputs.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::model {

// A tower's input for some items: pixels in its layout and, where its encoder needs
// them (Qwen's rotary positions and windows), the items' grids.
struct TowerInput {
  at::Tensor pixels;
  std::vector<plan::Grid> grids;
};

class VisionTower {
 public:
  virtual ~VisionTower() = default;

  // The pixels of `items` (held here, PixelInputs) in item order. Errors name the item.
  virtual TowerInput gather(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels) const = 0;

  // The input of no items ([0, ...] in the tower's layout) a rank without items runs
  // through hooked blocks, so that it calls their hooks as the others do.
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
