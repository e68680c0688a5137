// AdamW's state by parameter name (not by tensor address, as LibTorch keys it), so
// it can be written to a file and put back into a fresh optimizer over a fresh
// model. Exact: a restored optimizer steps bitwise like the one it came from.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mmsp/model/named_params.h"

namespace mmsp::train {

struct AdamWGroupState {
  double lr = 0.0;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  std::vector<std::string> params;  // the group's parameters by name, in order
};

struct AdamWParamMoments {
  int64_t step = 0;
  at::Tensor exp_avg, exp_avg_sq;
  at::Tensor max_exp_avg_sq;  // defined only with amsgrad
};

struct AdamWState {
  std::vector<AdamWGroupState> groups;
  // Parameters that have taken a step; one that never had a gradient has no entry.
  std::map<std::string, AdamWParamMoments> params;
};

// The optimizer's groups and state, named by `model`'s named_parameters() (a name
// used twice for one tensor: the first). The tensors are the optimizer's own (not
// copies). Every optimised parameter must be a parameter of `model`.
AdamWState capture_adamw_state(const torch::optim::AdamW& optimizer, const torch::nn::Module& model);
AdamWState capture_adamw_state(const torch::optim::AdamW& optimizer, const model::NamedParams& params);

// Puts `state` into `optimizer` (whose parameters are `model`'s): replaces all of its
// per-parameter state and sets each group's options. The groups must list the same
// names in the same order; each moment must have its parameter's shape. Everything
// is checked before anything changes; errors name `source`, the parameter and the rule.
void apply_adamw_state(const AdamWState& state, torch::optim::AdamW& optimizer, const torch::nn::Module& model,
                       const std::string& source);
void apply_adamw_state(const AdamWState& state, torch::optim::AdamW& optimizer, const model::NamedParams& params,
                       const std::string& source);

// As safetensors contents: tensors "<param>.exp_avg", "<param>.exp_avg_sq" (and
// "<param>.max_exp_avg_sq"); metadata "format": "mmsp.adamw" and "mmsp.adamw": JSON
// {"groups": [{"lr", "betas", "eps", "weight_decay", "amsgrad", "params"}],
//  "steps": {param: step}}.
std::map<std::string, at::Tensor> adamw_state_tensors(const AdamWState& state);
std::map<std::string, std::string> adamw_state_metadata(const AdamWState& state);
// The inverse; checks that tensors and metadata agree (each stepped parameter has
// both moments of one shape, no stray tensor). Errors name `source`.
AdamWState adamw_state_from(const std::map<std::string, at::Tensor>& tensors,
                            const std::map<std::string, std::string>& metadata, const std::string& source);

}  // namespace mmsp::train
