// A vision tower's chain of blocks as hook units (layer_hooks.h): each block runs
// between its hooks (ZeRO-2/3 gathers it before its forward and its backward, then
// reduces and frees it) and, under --checkpoint-activations all, is recomputed in the
// backward. Every tower (Qwen's, CLIP's, InternViT's) runs its blocks through one of
// these, so the units, their hooks and the recomputation are alike in every family.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "mmsp/model/hooks/layer_hooks.h"
#include "mmsp/model/hooks/recompute.h"

namespace mmsp::model {

class HookedBlocks {
 public:
  // The tower's blocks in the order it runs them, at construction. `runs` false: a block
  // the tower never runs (LLaVA's layers above vision_feature_layer): a unit never
  // gathered, whose gradient is zero.
  void add(std::shared_ptr<const torch::nn::Module> block, bool runs = true);

  // One unit per block. Block 0 is gathered at its use (the unit before it is not a
  // block), each later one prefetched by the one before it.
  std::vector<HookUnit> units() const;
  // The blocks become units first_unit, first_unit + 1, ...; null: no hooks.
  void set_hooks(std::shared_ptr<LayerHooks> hooks, size_t first_unit);
  // Hooked blocks gather, free and reduce with collectives: a rank without images must
  // still run them (on no rows), as the others do.
  bool hooked() const { return hooks_ != nullptr; }
  void set_recompute(bool on, std::shared_ptr<ActivationOffload> offload = nullptr) {
    recompute_ = on;
    offload_ = std::move(offload);
  }

  // y = block(x) for block i, between its hooks, recomputed in the backward when set.
  // `block` must capture by value what it reads: it may run again in the backward.
  at::Tensor run(size_t i, std::function<at::Tensor(const at::Tensor&)> block, const at::Tensor& x) const;

 private:
  struct Block {
    std::shared_ptr<const torch::nn::Module> module;  // its parameters() are the unit's
    bool runs = true;
  };
  std::vector<Block> blocks_;
  std::shared_ptr<LayerHooks> hooks_;
  size_t first_unit_ = 0;
  bool recompute_ = false;
  std::shared_ptr<ActivationOffload> offload_;  // recomputed blocks' inputs in host memory
};

}  // namespace mmsp::model
