// A tower's blocks between their hooks; see hooked_blocks.h.
#include "mmsp/model/hooks/hooked_blocks.h"

#include "mmsp/core/check.h"
#include "mmsp/model/hooks/recompute.h"

namespace mmsp::model {

void HookedBlocks::add(std::shared_ptr<const torch::nn::Module> block, bool runs) {
  blocks_.push_back(Block{std::move(block), runs});
}

std::vector<HookUnit> HookedBlocks::units() const {
  std::vector<HookUnit> units;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    HookUnit unit{blocks_[i].module->parameters()};
    unit.prefetched = i > 0 && blocks_[i - 1].runs && blocks_[i].runs;
    if (!blocks_[i].runs) {
      unit.forward_uses = 0;
      unit.backward_hooks = false;
    }
    units.push_back(std::move(unit));
  }
  return units;
}

void HookedBlocks::set_hooks(std::shared_ptr<LayerHooks> hooks, size_t first_unit) {
  hooks_ = std::move(hooks);
  first_unit_ = first_unit;
}

at::Tensor HookedBlocks::run(size_t i, std::function<at::Tensor(const at::Tensor&)> block, const at::Tensor& x) const {
  MMSP_CHECK(i < blocks_.size() && blocks_[i].runs, "HookedBlocks: block ", i, " of ", blocks_.size(),
             " is not one the tower runs");
  return run_hooked_layer(
      hooks_, first_unit_ + i,
      [&](const at::Tensor& in) {
        return recompute_ ? recompute_in_backward(block, in, blocks_[i].module->parameters(), offload_) : block(in);
      },
      x);
}

}  // namespace mmsp::model
