// The layer hooks' autograd nodes; see layer_hooks.h.
#include "mmsp/model/layer_hooks.h"

#include <torch/csrc/autograd/custom_function.h>

namespace mmsp::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct HookHolder : torch::CustomClassHolder {
  HookHolder(std::shared_ptr<LayerHooks> hooks, size_t index, bool before)
      : hooks(std::move(hooks)), index(index), before(before) {}
  std::shared_ptr<LayerHooks> hooks;
  size_t index;
  bool before;  // before_backward (on the layer's output) or after_backward (on its input)
};

// The identity whose backward calls a hook before passing the gradient on.
struct BackwardHook : torch::autograd::Function<BackwardHook> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const c10::intrusive_ptr<HookHolder>& hook) {
    ctx->saved_data["hook"] = c10::IValue::make_capsule(hook);
    return x;  // returned as a view with this node as its grad_fn: no copy
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto hook = c10::static_intrusive_pointer_cast<HookHolder>(ctx->saved_data["hook"].toCapsule());
    if (hook->before)
      hook->hooks->before_backward(hook->index);
    else
      hook->hooks->after_backward(hook->index);
    return {grads[0], at::Tensor()};
  }
};

at::Tensor on_backward(const std::shared_ptr<LayerHooks>& hooks, size_t index, bool before, const at::Tensor& t) {
  if (!t.requires_grad()) return t;  // no backward reaches it (inference)
  return BackwardHook::apply(t, c10::make_intrusive<HookHolder>(hooks, index, before));
}

}  // namespace

at::Tensor run_hooked_layer(const std::shared_ptr<LayerHooks>& hooks, size_t index,
                            const std::function<at::Tensor(const at::Tensor&)>& layer, const at::Tensor& x) {
  if (!hooks) return layer(x);
  const at::Tensor input = on_backward(hooks, index, /*before=*/false, x);
  hooks->before_forward(index);
  const at::Tensor y = layer(input);
  hooks->after_forward(index);
  return on_backward(hooks, index, /*before=*/true, y);
}

}  // namespace mmsp::model
