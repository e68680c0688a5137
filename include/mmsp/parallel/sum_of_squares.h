// Σ x² of a gradient in fp64, for the global norm that clipping takes: the replicated
// update's (train/optim/grad_clip.h) and ZeRO's over its shards (zero/sharded_model.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace mmsp::parallel {

// Σ x² over every element of `x`, in fp64, as a one-element fp64 tensor on x's device,
// summed a slice of 2^18 elements at a time: not a whole fp64 copy of x and its square
// (16 bytes an element: 4 GB for Qwen3.5-0.8B's embedding gradient).
at::Tensor sum_of_squares(const at::Tensor& x);

}  // namespace mmsp::parallel
