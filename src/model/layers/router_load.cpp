// A step's routing counts and auxiliary loss; see router_load.h.
#include "mmsp/model/layers/router_load.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mmsp/core/check.h"

namespace mmsp::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Holder : torch::CustomClassHolder {
  explicit Holder(std::shared_ptr<const RouterLoad> load) : load(std::move(load)) {}
  std::shared_ptr<const RouterLoad> load;
};

// out = out (forward); backward: out's gradient through, and g into the layer's
// probability sums, whatever reaches out (the aux loss is added to the step's loss).
struct AuxGradient : torch::autograd::Function<AuxGradient> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& out, const at::Tensor& prob_sum,
                            const c10::intrusive_ptr<Holder>& holder) {
    (void)prob_sum;
    ctx->saved_data["load"] = c10::IValue::make_capsule(holder);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<Holder>(ctx->saved_data["load"].toCapsule());
    MMSP_ASSERT(holder->load->finished(), "the aux loss's backward ran before its counts were summed");
    return {grads[0], holder->load->coefficients().clone(), at::Tensor()};
  }
};

}  // namespace

RouterLoad::RouterLoad(int64_t experts, int64_t sparse_layers, double aux_coef, int64_t real_tokens)
    : experts_(experts),
      layers_(sparse_layers),
      coef_(aux_coef),
      real_tokens_(real_tokens),
      counts_(at::zeros({sparse_layers, experts}, at::kDouble)),
      prob_sums_(sparse_layers) {}

at::Tensor RouterLoad::record(int64_t layer, const at::Tensor& out, const at::Tensor& counts,
                              const at::Tensor& prob_sum) {
  MMSP_ASSERT(layer >= 0 && layer < layers_);
  if (!finished_) {
    counts_[layer].copy_(counts.to(at::kCPU, at::kDouble));
    if (prob_sum.defined()) prob_sums_[layer] = prob_sum.detach();
  }
  if (coef_ == 0 || !prob_sum.defined() || !at::GradMode::is_enabled()) return out;
  return AuxGradient::apply(out, prob_sum, c10::make_intrusive<Holder>(shared_from_this()));
}

double RouterLoad::finish(const std::function<void(at::Tensor&)>& sum) {
  MMSP_ASSERT(!finished_, "a step's routing is summed once");
  // The counts and the real tokens in one message: integers, exact in float64 below 2^53.
  at::Tensor all = at::cat({counts_.reshape({-1}), at::full({1}, static_cast<double>(real_tokens_), at::kDouble)});
  if (sum) sum(all);
  counts_ = all.narrow(0, 0, layers_ * experts_).reshape({layers_, experts_});
  const double n = all[layers_ * experts_].item<double>() * static_cast<double>(layers_);
  finished_ = true;
  if (coef_ == 0 || n == 0) return 0;
  MMSP_ASSERT(prob_sums_.front().defined(), "the aux loss needs every sparse layer's probability sums");
  const at::Tensor picks = counts_.sum(0);  // C_e
  coefficients_ = (picks * (coef_ * static_cast<double>(experts_) / (n * n))).to(prob_sums_.front().options());
  double share = 0;
  for (const at::Tensor& p : prob_sums_) share += (coefficients_ * p).sum().item<double>();
  return share;
}

}  // namespace mmsp::model
