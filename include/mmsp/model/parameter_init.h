// How a model's constructor makes its parameters: with their random initialisation
// (the default), uninitialised (the weights are about to be loaded from a checkpoint,
// so drawing random numbers for billions of them is wasted time), or as meta tensors
// that carry a shape and no memory (to list and count a model's parameters, match a
// checkpoint against them and estimate memory before anything is allocated).
// The choice is a scope on the constructing thread; model code only calls new_parameter.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <functional>

namespace mmsp::model {

enum class ParameterInit { random, uninitialised, meta };

// Sets the mode for the constructors run on this thread while it lives (nests).
class ParameterInitScope {
 public:
  explicit ParameterInitScope(ParameterInit mode);
  ~ParameterInitScope();
  ParameterInitScope(const ParameterInitScope&) = delete;
  ParameterInitScope& operator=(const ParameterInitScope&) = delete;

 private:
  ParameterInit previous_;
};

ParameterInit current_parameter_init();

// A parameter of `shape` (default dtype, CPU): random_init(shape) in mode random,
// at::empty in mode uninitialised, a meta tensor in mode meta.
at::Tensor new_parameter(at::IntArrayRef shape, const std::function<at::Tensor(at::IntArrayRef)>& random_init);

// The common initialisations: N(0, std²), zeros, ones.
at::Tensor normal_parameter(at::IntArrayRef shape, double std);
at::Tensor zeros_parameter(at::IntArrayRef shape);
at::Tensor ones_parameter(at::IntArrayRef shape);

}  // namespace mmsp::model
