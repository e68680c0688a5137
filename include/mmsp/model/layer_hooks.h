// What happens around each decoder layer's use besides its computation: the points
// where ZeRO-2/3 (train/sharded_layer_hooks.h) gathers a layer's weights, frees them
// and reduce-scatters its gradients. The model calls them; train/ decides what they do.
//
// Every rank runs every decoder layer, in the same order, forward and backward, so the
// hooks are called in the same order on every rank and may run collectives. (Vision
// blocks are not hooked: a rank without images runs none of them.)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>

namespace mmsp::model {

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_forward(size_t layer) = 0;   // the layer's weights are about to be read
  virtual void after_forward(size_t layer) = 0;    // ... and are not read again until its backward
  virtual void before_backward(size_t layer) = 0;  // its backward (or recomputation) is next
  virtual void after_backward(size_t layer) = 0;   // its weights' gradients are complete
};

// y = layer(x) with the hooks of layer `index` around it. The backward hooks are two
// autograd nodes: one on y (runs before the layer's backward) and one on x (runs after
// it, once every gradient of the layer's weights has been accumulated: the autograd
// engine runs a layer's nodes, all created after x's node, before x's node). `hooks`
// may be null: then this is layer(x).
at::Tensor run_hooked_layer(const std::shared_ptr<LayerHooks>& hooks, size_t index,
                            const std::function<at::Tensor(const at::Tensor&)>& layer, const at::Tensor& x);

}  // namespace mmsp::model
