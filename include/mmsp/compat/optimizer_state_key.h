// The compat seam for torch::optim::Optimizer::state()'s key
// (docs/building.md#libtorch-versions).
//
// LibTorch 1.x keyed an optimizer's per-parameter state by the parameter's TensorImpl
// address printed as text (c10::guts::to_string, since removed); 2.11 and 2.15 key it
// by the address itself. Should a release change the key again, the assertion below
// fails here, at the one place that knows.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <type_traits>

namespace mmsp::compat {

using OptimizerStateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
static_assert(std::is_same_v<OptimizerStateKey, void*>,
              "torch::optim::Optimizer::state() is no longer keyed by TensorImpl*: "
              "update mmsp/compat/optimizer_state_key.h");

inline OptimizerStateKey optimizer_state_key(const at::Tensor& parameter) { return parameter.unsafeGetTensorImpl(); }

}  // namespace mmsp::compat
