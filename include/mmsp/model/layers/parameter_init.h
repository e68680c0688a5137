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

// Sets the mode for the constructors run on this thread while it lives (nests), and
// the dtype the parameters are made in: a random draw is made in fp32 and rounded to it
// parameter by parameter (the same values as a whole fp32 model converted afterwards,
// without ever holding that model: 3.4 GB per rank for a 0.85 B-parameter bf16 run).
class ParameterInitScope {
 public:
  explicit ParameterInitScope(ParameterInit mode, at::ScalarType dtype = at::kFloat);
  ~ParameterInitScope();
  ParameterInitScope(const ParameterInitScope&) = delete;
  ParameterInitScope& operator=(const ParameterInitScope&) = delete;

 private:
  ParameterInit previous_;
  at::ScalarType previous_dtype_;
};

ParameterInit current_parameter_init();

// A parameter of `shape` (the scope's dtype, CPU): random_init(shape) in mode random,
// at::empty in mode uninitialised, a meta tensor in mode meta.
at::Tensor new_parameter(at::IntArrayRef shape, const std::function<at::Tensor(at::IntArrayRef)>& random_init);

// The common initialisations: N(0, std²), zeros, ones.
at::Tensor normal_parameter(at::IntArrayRef shape, double std);
at::Tensor zeros_parameter(at::IntArrayRef shape);
at::Tensor ones_parameter(at::IntArrayRef shape);

}  // namespace mmsp::model
