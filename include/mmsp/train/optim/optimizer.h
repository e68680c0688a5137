// AdamW with the usual two parameter groups: weight decay on matrices, none on
// biases, norm weights and other 1-D (or 0-D) parameters.
#pragma once

#include <torch/optim/adamw.h>

#include <memory>

#include "mmsp/model/named_params.h"

namespace mmsp::train {

// Usage: make_adamw(named_params, {3e-4, 0.9, 0.95, 1e-8, 0.1}).
struct AdamWOptions {
  double lr = 1e-4;           // ≥ 0 (a schedule usually overrides it)
  double beta1 = 0.9;         // in [0, 1)
  double beta2 = 0.999;       // in [0, 1)
  double eps = 1e-8;          // > 0
  double weight_decay = 0.0;  // ≥ 0; decoupled, matrices only
};

// Throws mmsp::Error naming the first option out of its range above.
void check_adamw_options(const AdamWOptions& options);

// Group 0: parameters with dim ≥ 2, weight_decay as given. Group 1: the others,
// weight_decay 0. Both groups always exist (possibly empty), in that order, with
// parameters in the order given, so a checkpoint's groups line up. Names must be
// unique and tensors distinct (a tied weight is passed once).
std::unique_ptr<torch::optim::AdamW> make_adamw(const model::NamedParams& named_params, const AdamWOptions& options);

// Sets the learning rate of every group (the schedule's value for this step).
void set_lr(torch::optim::AdamW& optimizer, double lr);

}  // namespace mmsp::train
