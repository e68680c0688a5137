// Activation checkpointing as an autograd Function; see recompute.h.
#include "mmsp/model/hooks/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

#include "mmsp/core/check.h"
#include "mmsp/model/hooks/activation_offload.h"

namespace mmsp::model {

ActivationCheckpointing parse_activation_checkpointing(const std::string& name) {
  if (name == "none") return ActivationCheckpointing::none;
  if (name == "decoder") return ActivationCheckpointing::decoder;
  if (name == "all") return ActivationCheckpointing::all;
  MMSP_FAIL("--checkpoint-activations '", name,
            "' must be none, decoder (recompute each decoder layer) or all (and each vision block)");
}

const char* to_string(ActivationCheckpointing mode) {
  switch (mode) {
    case ActivationCheckpointing::none:
      return "none";
    case ActivationCheckpointing::decoder:
      return "decoder";
    case ActivationCheckpointing::all:
      return "all";
  }
  return "?";
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using LayerFn = std::function<at::Tensor(const at::Tensor&)>;

// The layer and its parameters, kept by the node until its backward (saved_data holds
// IValues: a capsule carries them).
struct Layer : torch::CustomClassHolder {
  Layer(LayerFn fn, std::vector<at::Tensor> parameters, std::shared_ptr<ActivationOffload> offload)
      : fn(std::move(fn)), parameters(std::move(parameters)), offload(std::move(offload)) {}
  LayerFn fn;
  std::vector<at::Tensor> parameters;
  std::shared_ptr<ActivationOffload> offload;   // null: x is saved on its device
  std::shared_ptr<ActivationOffload::Entry> x;  // with offload: x's host copy
};

struct Recompute : torch::autograd::Function<Recompute> {
  // Inputs: x, then the parameters (so their gradients take autograd's usual path to .grad).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList parameters,
                            const c10::intrusive_ptr<Layer>& layer) {
    (void)parameters;
    if (layer->offload)
      layer->x = layer->offload->stash(x);
    else
      ctx->save_for_backward({x});
    ctx->saved_data["layer"] = c10::IValue::make_capsule(layer);
    return layer->fn(x);  // Function::apply runs this with grad off: nothing is kept
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto layer = c10::static_intrusive_pointer_cast<Layer>(ctx->saved_data["layer"].toCapsule());
    const at::Tensor saved = layer->offload ? layer->offload->restore(*layer->x) : ctx->get_saved_variables()[0];
    layer->x.reset();  // the host copy is not needed again
    const at::Tensor x = saved.detach().requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode with_grad(true);
      y = layer->fn(x);
    }
    variable_list inputs{x};
    inputs.insert(inputs.end(), layer->parameters.begin(), layer->parameters.end());
    // allow_unused: a parameter the layer leaves out of this step gets no gradient.
    variable_list got = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false,
                                              /*create_graph=*/false, /*allow_unused=*/true);
    got.emplace_back();  // the layer capsule: no gradient
    return got;
  }
};

}  // namespace

at::Tensor recompute_in_backward(LayerFn layer, const at::Tensor& x, const std::vector<at::Tensor>& parameters,
                                 const std::shared_ptr<ActivationOffload>& offload) {
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& p : parameters)
    if (p.requires_grad()) trainable.push_back(p);
  // No backward will read x back (inference): nothing to stash.
  const bool stash = offload && at::GradMode::is_enabled();
  auto holder = c10::make_intrusive<Layer>(std::move(layer), trainable, stash ? offload : nullptr);
  return Recompute::apply(x, at::TensorList(trainable), holder);
}

}  // namespace mmsp::model
