// Global-norm gradient clipping; see grad_clip.h.
#include "mmsp/train/optim/grad_clip.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mmsp/core/check.h"
#include "mmsp/parallel/sum_of_squares.h"

namespace mmsp::train {

namespace {

// Σ g² of each defined gradient (fp64, on its device), by parameter index.
std::vector<std::pair<size_t, at::Tensor>> squares_of(const model::NamedParams& named_params) {
  std::vector<std::pair<size_t, at::Tensor>> squares;
  for (size_t i = 0; i < named_params.size(); ++i) {
    const at::Tensor& grad = named_params[i].second.grad();
    if (grad.defined()) squares.emplace_back(i, parallel::sum_of_squares(grad));
  }
  return squares;
}

double total_of(const std::vector<std::pair<size_t, at::Tensor>>& squares) {
  std::vector<at::Tensor> per_device;  // one running sum per device: one copy each
  for (const auto& entry : squares) {
    const at::Tensor& s = entry.second;
    auto same = std::find_if(per_device.begin(), per_device.end(),
                             [&](const at::Tensor& t) { return t.device() == s.device(); });
    if (same == per_device.end())
      per_device.push_back(s.clone());
    else
      same->add_(s);
  }
  double sum = 0.0;
  for (const at::Tensor& t : per_device) sum += t.item<double>();
  return sum;
}

}  // namespace

double clip_grad_norm(const model::NamedParams& whole, const model::NamedParams& split, double max_norm,
                      const std::function<double(double)>& sum) {
  at::NoGradGuard no_grad;
  const double norm = clip_grad_norm(whole, 0.0);  // measures, and names a non-finite gradient
  const auto split_squares = squares_of(split);
  const double total = std::sqrt(norm * norm + sum(total_of(split_squares)));
  MMSP_CHECK(std::isfinite(total), "gradient norm is ", total, " (not finite) with the expert-parallel experts' ",
             "gradients; lower the learning rate or check the data");
  if (max_norm > 0 && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    for (const auto& [name, p] : whole)
      if (p.grad().defined()) p.grad().mul_(scale);
    for (const auto& [i, s] : split_squares) split[i].second.grad().mul_(scale);
  }
  return total;
}

double clip_grad_norm(const model::NamedParams& named_params, double max_norm) {
  at::NoGradGuard no_grad;
  // Σ g² per parameter in fp64, kept on the grads' device until one read at the end.
  const auto squares = squares_of(named_params);
  const double total = std::sqrt(total_of(squares));
  if (!std::isfinite(total)) {
    std::string culprit = "(none found)";
    for (const auto& [i, s] : squares)
      if (!std::isfinite(s.item<double>())) {
        culprit = "\"" + named_params[i].first + "\"";
        break;
      }
    MMSP_FAIL("gradient norm is ", total, " (not finite); first parameter with a ", "non-finite gradient: ", culprit,
              ". Lower the learning rate or check the data");
  }
  if (max_norm > 0 && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    for (const auto& [i, s] : squares) named_params[i].second.grad().mul_(scale);
  }
  return total;
}

}  // namespace mmsp::train
