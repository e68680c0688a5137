// Gradient clipping by the global L2 norm. After GradSync every rank holds the same
// gradients, so each computes the same norm without communicating.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/train/optim/named_params.h"

namespace mmsp::train {

// Σ x² over every element of `x`, in fp64, as a one-element fp64 tensor on x's device,
// summed a slice of 2^18 elements at a time: not a whole fp64 copy of x and its square
// (16 bytes an element: 4 GB for Qwen3.5-0.8B's embedding gradient).
at::Tensor sum_of_squares(const at::Tensor& x);

// The L2 norm of all gradients together (undefined grads count as zeros), summed
// in fp64 whatever the grads' dtype. When max_norm > 0 and the norm exceeds it,
// every grad is scaled in place by max_norm / (norm + 1e-6) (PyTorch's
// clip_grad_norm_ convention); max_norm ≤ 0 only measures. Returns the norm before
// clipping. A non-finite norm is an mmsp::Error naming the norm and the first
// parameter whose gradient is not finite; nothing is scaled then.
double clip_grad_norm(const NamedParams& named_params, double max_norm);

}  // namespace mmsp::train
