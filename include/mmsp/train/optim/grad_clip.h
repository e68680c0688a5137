// Gradient clipping by the global L2 norm. After parallel::GradSync every rank holds the same
// gradients, so each computes the same norm without communicating.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

#include "mmsp/model/named_params.h"

namespace mmsp::train {

// The L2 norm of all gradients together (undefined grads count as zeros), summed
// in fp64 whatever the grads' dtype. When max_norm > 0 and the norm exceeds it,
// every grad is scaled in place by max_norm / (norm + 1e-6) (PyTorch's
// clip_grad_norm_ convention); max_norm ≤ 0 only measures. Returns the norm before
// clipping. A non-finite norm is an mmsp::Error naming the norm and the first
// parameter whose gradient is not finite; nothing is scaled then.
double clip_grad_norm(const model::NamedParams& named_params, double max_norm);

// The same over `whole` (every rank holds the same gradients) and `split` (parameters
// split over ranks, each rank holding a share: expert parallelism's experts), whose Σ g²
// `sum` adds up over those ranks; every rank gets the same norm and scale.
double clip_grad_norm(const model::NamedParams& whole, const model::NamedParams& split, double max_norm,
                      const std::function<double(double)>& sum);

}  // namespace mmsp::train
