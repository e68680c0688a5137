// AdamW with decay / no-decay groups; see optimizer.h.
#include "mmsp/train/optim/optimizer.h"

#include <cmath>

#include "mmsp/core/check.h"

namespace mmsp::train {

void check_adamw_options(const AdamWOptions& options) {
  const double beta1 = options.beta1, beta2 = options.beta2;
  MMSP_CHECK(std::isfinite(options.lr) && options.lr >= 0, "AdamW: lr (", options.lr, ") must be a finite number ≥ 0");
  MMSP_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "AdamW: betas (", beta1, ", ", beta2,
             ") must each be in [0, 1)");
  MMSP_CHECK(std::isfinite(options.eps) && options.eps > 0, "AdamW: eps (", options.eps,
             ") must be a positive finite number");
  MMSP_CHECK(std::isfinite(options.weight_decay) && options.weight_decay >= 0, "AdamW: weight_decay (",
             options.weight_decay, ") must be a finite number ≥ 0");
}

std::unique_ptr<torch::optim::AdamW> make_adamw(const model::NamedParams& named_params, const AdamWOptions& options) {
  check_adamw_options(options);
  const double beta1 = options.beta1, beta2 = options.beta2;
  model::check_named_params(named_params, "AdamW");

  std::vector<at::Tensor> decay, no_decay;
  for (const auto& [name, p] : named_params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto group_options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(options.lr).betas({beta1, beta2}).eps(options.eps).weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, group_options(options.weight_decay));
  groups.emplace_back(no_decay, group_options(0.0));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), *group_options(options.weight_decay));
}

void set_lr(torch::optim::AdamW& optimizer, double lr) {
  MMSP_CHECK(std::isfinite(lr) && lr >= 0, "set_lr: lr (", lr, ") must be a finite number ≥ 0");
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace mmsp::train
