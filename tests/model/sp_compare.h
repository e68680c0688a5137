// What the model's SP tests compare: the loss and every parameter gradient of one step,
// summed over the ranks, against one process. Shared by test_vlm_sp and test_hybrid_sp.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "mmsp/dist/all_reduce.h"

namespace mmsp::test {

struct StepResult {
  double loss = 0;
  std::vector<std::pair<std::string, at::Tensor>> grads;  // by parameter name
};

// The loss and every parameter gradient of `module` (zeros where it has none), summed
// over `world`: what one process computes for the whole batch.
inline StepResult summed_over(const torch::nn::Module& module, const at::Tensor& loss,
                              const dist::GroupPtr& world) {
  StepResult r;
  at::Tensor total = loss.detach().reshape({1});
  dist::all_reduce_(total, *world);
  r.loss = total.item<double>();
  for (const auto& item : module.named_parameters()) {
    at::Tensor g = item.value().grad().defined() ? item.value().grad().clone() : at::zeros_like(item.value());
    dist::all_reduce_(g, *world);
    r.grads.emplace_back(item.key(), g);
  }
  return r;
}

// Loss and every gradient within rtol. A gradient that is exactly zero in exact
// arithmetic (e.g. a key bias: softmax ignores a constant shift) is compared against
// a floor of rtol/1000 of the model's largest gradient: its rounding noise (which
// scales with the dtype) carries no meaning.
inline void expect_same_step(const StepResult& got, const StepResult& ref, double rtol, const std::string& where) {
  EXPECT_NEAR(got.loss, ref.loss, rtol * ref.loss) << where;
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << where;
  double model_scale = 0;
  for (const auto& [name, g] : ref.grads) model_scale = std::max(model_scale, g.abs().max().item<double>());
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].first, ref.grads[i].first) << where;
    const double scale = ref.grads[i].second.abs().max().item<double>();
    const double diff = (got.grads[i].second - ref.grads[i].second).abs().max().item<double>();
    EXPECT_LE(diff, rtol * (scale + 1e-3 * model_scale)) << where << " gradient of " << ref.grads[i].first;
  }
}

}  // namespace mmsp::test
