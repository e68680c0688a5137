// Parameter creation modes; see parameter_init.h.
#include "mmsp/model/layers/parameter_init.h"

#include <ATen/ATen.h>

namespace mmsp::model {
namespace {
thread_local ParameterInit t_mode = ParameterInit::random;
thread_local at::ScalarType t_dtype = at::kFloat;
}  // namespace

ParameterInitScope::ParameterInitScope(ParameterInit mode, at::ScalarType dtype)
    : previous_(t_mode), previous_dtype_(t_dtype) {
  t_mode = mode;
  t_dtype = dtype;
}
ParameterInitScope::~ParameterInitScope() {
  t_mode = previous_;
  t_dtype = previous_dtype_;
}

ParameterInit current_parameter_init() { return t_mode; }

at::Tensor new_parameter(at::IntArrayRef shape, const std::function<at::Tensor(at::IntArrayRef)>& random_init) {
  switch (t_mode) {
    case ParameterInit::meta:
      return at::empty(shape, at::TensorOptions().device(at::kMeta).dtype(t_dtype));
    case ParameterInit::uninitialised:
      return at::empty(shape, at::TensorOptions().dtype(t_dtype));
    case ParameterInit::random:
      break;
  }
  at::Tensor drawn = random_init(shape);
  return drawn.scalar_type() == t_dtype ? drawn : drawn.to(t_dtype);
}

at::Tensor normal_parameter(at::IntArrayRef shape, double std) {
  return new_parameter(shape, [std](at::IntArrayRef s) { return at::randn(s) * std; });
}
at::Tensor zeros_parameter(at::IntArrayRef shape) {
  return new_parameter(shape, [](at::IntArrayRef s) { return at::zeros(s); });
}
at::Tensor ones_parameter(at::IntArrayRef shape) {
  return new_parameter(shape, [](at::IntArrayRef s) { return at::ones(s); });
}

}  // namespace mmsp::model
