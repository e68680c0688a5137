// The vision tower's share of a step's memory; see vision_load.h.
#include "mmsp/train/memory/vision_load.h"

#include <c10/core/ScalarType.h>

#include <algorithm>

#include "mmsp/model/family.h"
#include "mmsp/model/vision/vision_memory.h"

namespace mmsp::train {

std::vector<VisionLoad> vision_loads(const plan::StepPlan& plan, model::VisionMode mode) {
  const int S = plan.options.mesh.context();
  std::vector<VisionLoad> loads;
  for (const plan::RowPlan& row : plan.rows) {
    std::vector<VisionLoad> group(S);
    int64_t row_rows = 0;
    for (int r = 0; r < S; ++r) group[r].dp = row.dp, group[r].context_rank = r;
    for (const plan::VisionItem& item : row.items) {
      row_rows += item.rows;
      const int64_t per_row = item.rows > 0 ? item.patches / item.rows : 0;
      for (int r = 0; r < S; ++r) {
        // replicate: every rank of the row encodes every item whole.
        const int64_t rows = mode == model::VisionMode::replicate ? item.rows : item.rows_encoded_by(r);
        if (rows == 0) continue;
        group[r].rows += rows;
        group[r].tokens += mode == model::VisionMode::replicate || !item.split() ? item.patches : rows * per_row;
        group[r].largest_item = std::max(group[r].largest_item, item.patches);
      }
      for (const auto& [rank, held] : plan::held_rows(item, row.shards)) group[rank].received_rows += held;
    }
    if (mode == model::VisionMode::gather)  // every rank gets the row's every row, keeps its own
      for (VisionLoad& l : group) l.received_rows = row_rows;
    loads.insert(loads.end(), group.begin(), group.end());
  }
  return loads;
}

namespace {

// `load`'s bytes under the family's per-patch shape `s` (read once per step by busiest_vision).
VisionBytes bytes_of(const model::VisionMemoryShape& s, const VisionLoad& load,
                     model::ActivationCheckpointing checkpointing, at::ScalarType dtype) {
  const int64_t b = static_cast<int64_t>(c10::elementSize(dtype)), N = load.tokens;
  const bool recomputed = checkpointing == model::ActivationCheckpointing::all;
  VisionBytes out;
  // The pixels (loaded in the compute dtype), each block's activations (recomputed: its
  // input alone), what the embedding and merger keep, and the rows out and in.
  const int64_t blocks = s.blocks * (recomputed ? s.width : s.kept_per_block);
  out.kept = (N * (s.pixels_per_token + blocks + s.kept_outside) + (load.rows + load.received_rows) * s.row_width) * b;
  // One block's backward: its transients, and the activations of the block being
  // recomputed when the blocks are.
  out.transient = N * (s.block_transient + (recomputed ? s.kept_per_block : 0)) * b;
  return out;
}

model::VisionMemoryShape shape_of(const model::ModelConfig& config) {
  return model::family_for(config.model_type).vision_memory(config);
}

}  // namespace

VisionBytes vision_bytes(const model::ModelConfig& config, const VisionLoad& load,
                         model::ActivationCheckpointing checkpointing, at::ScalarType dtype) {
  return bytes_of(shape_of(config), load, checkpointing, dtype);
}

BusiestVision busiest_vision(const model::ModelConfig& config, const std::vector<VisionLoad>& loads,
                             model::ActivationCheckpointing checkpointing, at::ScalarType dtype) {
  const model::VisionMemoryShape shape = shape_of(config);
  BusiestVision busiest;
  for (const VisionLoad& load : loads) {
    const VisionBytes bytes = bytes_of(shape, load, checkpointing, dtype);
    if (bytes.total() > busiest.bytes.total()) busiest = {load, bytes};
  }
  return busiest;
}

int64_t prefetched_pixel_bytes(const model::ModelConfig& config, const std::vector<VisionLoad>& loads,
                               at::ScalarType dtype) {
  const int64_t per_token = shape_of(config).pixels_per_token * (static_cast<int64_t>(c10::elementSize(dtype)) + 2);
  int64_t most = 0;
  for (const VisionLoad& load : loads) most = std::max(most, load.tokens * per_token);
  return most;
}

}  // namespace mmsp::train
