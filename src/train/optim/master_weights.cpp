// fp32 masters for bf16 parameters; see master_weights.h.
#include "mmsp/train/optim/master_weights.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"

namespace mmsp::train {

MasterWeights::MasterWeights(model::NamedParams model_params, at::ScalarType master_dtype)
    : model_(std::move(model_params)), dtype_(master_dtype) {
  model::check_named_params(model_, "MasterWeights");
  for (const auto& [name, p] : model_) mixed_ = mixed_ || p.scalar_type() != master_dtype;
  if (!mixed_) {
    masters_ = model_;
    return;
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : model_)
    masters_.emplace_back(name, p.detach().to(master_dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_());
}

void MasterWeights::take_grads() {
  if (!mixed_) return;
  for (size_t i = 0; i < model_.size(); ++i) {
    at::Tensor& g = model_[i].second.mutable_grad();
    at::Tensor& master_grad = masters_[i].second.mutable_grad();
    if (!g.defined()) {
      master_grad.reset();
      continue;
    }
    if (master_grad.defined()) {
      master_grad.copy_(g);
    } else {
      master_grad = g.to(dtype_);
    }
    g.reset();
  }
}

void MasterWeights::copy_to_model() {
  if (!mixed_) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i) model_[i].second.copy_(masters_[i].second);
}

}  // namespace mmsp::train
