// What every family's step takes and returns; see vlm.h.
#include "mmsp/model/vlm.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"

namespace mmsp::model {

at::Tensor StepOutput::logits() const { return at::linear(hidden, head_weight); }

int64_t PixelInputs::first_row(const plan::VisionItem& item, int64_t whole_batch_row) const {
  const std::vector<int64_t>& offsets = item.kind == plan::VisionKind::image ? image_offsets : video_offsets;
  if (offsets.empty()) return whole_batch_row;
  const int64_t row = item.batch_index < static_cast<int64_t>(offsets.size()) ? offsets[item.batch_index] : -1;
  MMSP_CHECK(row >= 0, "pixels of ", plan::to_string(item.kind), " ", item.batch_index,
             " are not held on this rank (its pixels hold the items it encodes)");
  return row;
}

void Vlm::set_activation_checkpointing(ActivationCheckpointing mode) {
  decoder().set_recompute_layers(mode != ActivationCheckpointing::none);
  vision_blocks().set_recompute(mode == ActivationCheckpointing::all);
}

std::vector<HookUnit> Vlm::hook_units() const {
  std::vector<HookUnit> units = decoder().hook_units();
  for (HookUnit& block : vision_blocks().units()) units.push_back(std::move(block));
  return units;
}

void Vlm::set_layer_hooks(std::shared_ptr<LayerHooks> hooks) {
  vision_blocks().set_hooks(hooks, decoder().hook_units().size());
  decoder().set_layer_hooks(std::move(hooks));
}

}  // namespace mmsp::model
