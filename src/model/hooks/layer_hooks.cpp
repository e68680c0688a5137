// The layer hooks' autograd nodes; see layer_hooks.h.
#include "mmsp/model/hooks/layer_hooks.h"

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

// weight[ids], detached from the weight: a gradient edge to the weight would make
// autograd hold the weight's other gradients (a tied head's, from the loss) until this
// node's backward, the last of the step, before accumulating any of them. The backward
// hands the output's gradient to the hooks as rows. `anchor` is an empty leaf that
// requires a gradient, so that the engine runs this backward at all; it gets none.
struct LookupRows : torch::autograd::Function<LookupRows> {
  // A row-sharded unit's rows are looked up where they are kept (`weight` is not read).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& anchor, const at::Tensor& weight,
                            const at::Tensor& token_ids, const c10::intrusive_ptr<HookHolder>& hook) {
    ctx->saved_data["hook"] = c10::IValue::make_capsule(hook);
    ctx->saved_data["ids"] = token_ids;
    if (const auto rows = hook->hooks->row_sharded(hook->index)) return rows->lookup(token_ids);
    return at::embedding(weight, token_ids);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto hook = c10::static_intrusive_pointer_cast<HookHolder>(ctx->saved_data["hook"].toCapsule());
    const at::Tensor ids = ctx->saved_data["ids"].toTensor().reshape({-1});
    const at::Tensor& grad = grads[0];
    hook->hooks->lookup_backward(hook->index, ids, grad.reshape({ids.size(0), grad.size(-1)}));
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor hooked_lookup(const std::shared_ptr<LayerHooks>& hooks, size_t unit, const at::Tensor& weight,
                         const at::Tensor& token_ids) {
  const std::shared_ptr<RowShardedWeight> rows = hooks ? hooks->row_sharded(unit) : nullptr;
  if (!hooks || !weight.requires_grad() || !at::GradMode::is_enabled()) {
    if (rows) return rows->lookup(token_ids);  // the table is never whole here
    return at::embedding(weight, token_ids);
  }
  const at::Tensor anchor = at::empty({0}, weight.options()).requires_grad_();
  return LookupRows::apply(anchor, weight.detach(), token_ids, c10::make_intrusive<HookHolder>(hooks, unit, false));
}

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
