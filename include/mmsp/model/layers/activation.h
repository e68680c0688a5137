// The activations Hugging Face configs name (hidden_act, projector_hidden_act).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace mmsp::model {

// silu, gelu (erf), gelu_pytorch_tanh, quick_gelu (x·σ(1.702x)), relu; anything else
// is an error naming it.
at::Tensor activation(const std::string& name, const at::Tensor& x);

// Whether activation() implements `name`.
bool is_supported_activation(const std::string& name);

}  // namespace mmsp::model
