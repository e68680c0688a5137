// What the model's SP tests share (tests/model, tests/model/families): the token ids and
// builders of their batches, and the comparison of the loss and every parameter
// gradient of one step, summed over the ranks, against one process.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "mmsp/dist/all_reduce.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::test {

// Vision token ids of the tiny test configs (vocab 128; text ids stay below 100).
constexpr int64_t kStart = 120, kEnd = 121, kImage = 122, kVideo = 123;

// n text tokens, different for each seed.
inline void text(plan::Sequence& s, int n, int64_t seed) {
  for (int i = 0; i < n; ++i) s.input_ids.push_back((seed * 31 + i * 7) % 100);
}
// A vision block: start, `rows` placeholders of `token`, end.
inline void block(plan::Sequence& s, int64_t token, int rows) {
  s.input_ids.push_back(kStart);
  for (int i = 0; i < rows; ++i) s.input_ids.push_back(token);
  s.input_ids.push_back(kEnd);
}

struct StepResult {
  double loss = 0;
  std::vector<std::pair<std::string, at::Tensor>> grads;  // by parameter name
};

// The loss and every parameter gradient of `module` (zeros where it has none), summed
// over `world`: what one process computes for the whole batch.
inline StepResult summed_over(const torch::nn::Module& module, const at::Tensor& loss, const dist::GroupPtr& world) {
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
