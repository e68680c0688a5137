// What happens around each use of a hooked unit's weights besides its computation: the
// points where ZeRO-2/3 (parallel/zero/zero_hooks.h) gathers the unit's weights, frees them
// and reduce-scatters its gradients, and where the token lookup hands over its gradient
// as rows. The model calls them; parallel/ decides what they do.
// The units are the model's (Vlm::hook_units): the decoder's layers 0 … L−1, the LM
// head (L), the token embedding (L + 1) when it is not tied to the head, then the vision
// tower's blocks (HookedBlocks: Qwen's blocks, CLIP's and InternViT's encoder layers).
//
// Every rank runs every unit, in the same order, forward and backward, so the hooks are
// called in the same order on every rank and may run collectives (all but
// lookup_backward). A rank that encodes no image runs the hooked vision blocks on no
// rows for that reason: a gather that some ranks skip would hang the others.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "mmsp/model/hooks/row_sharded_weight.h"

namespace mmsp::model {

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_forward(size_t layer) = 0;   // the layer's weights are about to be read
  virtual void after_forward(size_t layer) = 0;    // ... and are not read again until its backward
  virtual void before_backward(size_t layer) = 0;  // its backward (or recomputation) is next
  virtual void after_backward(size_t layer) = 0;   // its weights' gradients are complete
  // The token lookup's backward (hooked_lookup): the gradient of output row i belongs
  // to row token_ids[i] of the unit's weight. It arrives as these [n, h] rows instead of
  // a dense [V, h] gradient, so no rank ever holds the whole table's gradient for a few
  // thousand tokens. Called inside the backward: it must not run collectives (ranks
  // without images reach it at another point of the backward than ranks with them).
  virtual void lookup_backward(size_t unit, const at::Tensor& token_ids, const at::Tensor& grad_rows) = 0;
  // A unit whose table is read by rows, not whole (HookUnit::vocab_rows, under ZeRO-3):
  // the head's loss reads it in rounds, the lookup the rows of its tokens; its other
  // hooks neither gather nor reduce it. Null: the unit is gathered whole around its uses.
  virtual std::shared_ptr<RowShardedWeight> row_sharded(size_t /*unit*/) { return nullptr; }
};

// One hooked unit and how a step uses it, so that ZeRO knows how often its weights are
// gathered, when its gradients are complete and whether a neighbour prefetches it.
struct HookUnit {
  std::vector<at::Tensor> parameters;
  int forward_uses = 1;        // before_forward / after_forward pairs per step
  bool backward_hooks = true;  // before_backward / after_backward run: its weights are read again,
                               // and its dense gradient is complete at after_backward
  bool lookup_rows = false;    // the token lookup reads it: that gradient comes as rows
                               // (LayerHooks::lookup_backward), after the backward
  bool vocab_rows = false;     // a [V, h] table (the head, the embedding) that may be read by rows
                               // (LayerHooks::row_sharded) instead of whole
  bool prefetched = true;      // the forward reaches it right after unit − 1 (and the backward
                               // unit − 1 right after it), so that one may issue its gather early
                               // (false: the first of a chain, such as vision block 0)
  // A unit the step never reads (LLaVA's CLIP layers above vision_feature_layer): no
  // forward uses, no backward hooks, not prefetched. Never gathered; its gradient is zero.
};

// y = layer(x) with the hooks of layer `index` around it. The backward hooks are two
// autograd nodes: one on y (runs before the layer's backward) and one on x (runs after
// it, once every gradient of the layer's weights has been accumulated: the autograd
// engine runs a layer's nodes, all created after x's node, before x's node). `hooks`
// may be null: then this is layer(x).
at::Tensor run_hooked_layer(const std::shared_ptr<LayerHooks>& hooks, size_t index,
                            const std::function<at::Tensor(const at::Tensor&)>& layer, const at::Tensor& x);

// weight[token_ids] whose backward gives the output's gradient to hooks->lookup_backward
// as rows, and nothing to `weight`'s dense gradient. Without hooks (or without a
// gradient to take) it is at::embedding. A row-sharded unit's rows come from its
// RowShardedWeight (hooks->row_sharded): `weight` is not read then.
at::Tensor hooked_lookup(const std::shared_ptr<LayerHooks>& hooks, size_t unit, const at::Tensor& weight,
                         const at::Tensor& token_ids);

}  // namespace mmsp::model
