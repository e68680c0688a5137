// Global-norm gradient clipping; see grad_clip.h.
#include "mmsp/train/optim/grad_clip.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mmsp/core/check.h"
#include "mmsp/parallel/sum_of_squares.h"

namespace mmsp::train {

double clip_grad_norm(const model::NamedParams& named_params, double max_norm) {
  at::NoGradGuard no_grad;
  // Σ g² per parameter in fp64, kept on the grads' device until one read at the end.
  std::vector<std::pair<size_t, at::Tensor>> squares;
  for (size_t i = 0; i < named_params.size(); ++i) {
    const at::Tensor& grad = named_params[i].second.grad();
    if (grad.defined()) squares.emplace_back(i, parallel::sum_of_squares(grad));
  }
  std::vector<at::Tensor> per_device;  // one running sum per device: one copy each
  for (const auto& entry : squares) {
    const at::Tensor& s = entry.second;
    auto same = std::find_if(per_device.begin(), per_device.end(),
                             [&](const at::Tensor& t) { return t.device() == s.device(); });
    if (same == per_device.end()) per_device.push_back(s.clone());
    else same->add_(s);
  }
  double sum = 0.0;
  for (const at::Tensor& t : per_device) sum += t.item<double>();
  const double total = std::sqrt(sum);
  if (!std::isfinite(total)) {
    std::string culprit = "(none found)";
    for (const auto& [i, s] : squares)
      if (!std::isfinite(s.item<double>())) {
        culprit = "\"" + named_params[i].first + "\"";
        break;
      }
    MMSP_FAIL("gradient norm is ", total, " (not finite); first parameter with a ",
              "non-finite gradient: ", culprit, ". Lower the learning rate or check the data");
  }
  if (max_norm > 0 && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    for (const auto& [i, s] : squares) named_params[i].second.grad().mul_(scale);
  }
  return total;
}

}  // namespace mmsp::train
