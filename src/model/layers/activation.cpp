// Activations by Hugging Face name; see activation.h.
#include "mmsp/model/layers/activation.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"

namespace mmsp::model {

at::Tensor activation(const std::string& name, const at::Tensor& x) {
  if (name == "silu") return at::silu(x);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "quick_gelu") return x * at::sigmoid(1.702 * x);
  if (name == "relu") return at::relu(x);
  MMSP_FAIL("activation '", name, "' is not supported (silu, gelu, gelu_pytorch_tanh, quick_gelu, relu)");
}

bool is_supported_activation(const std::string& name) {
  return name == "silu" || name == "gelu" || name == "gelu_pytorch_tanh" || name == "quick_gelu" || name == "relu";
}

}  // namespace mmsp::model
