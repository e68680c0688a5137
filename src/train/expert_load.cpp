// A step's expert load; see expert_load.h.
#include "expert_load.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace mmsp::train {
namespace {

// The largest, over layers, of the busiest column's rows over the mean column's ([layers, n]).
double worst_ratio(const at::Tensor& per_layer) {
  const at::Tensor mean = per_layer.mean(1), busiest = std::get<0>(per_layer.max(1));
  const at::Tensor ratio = at::where(mean > 0, busiest / mean, at::ones_like(mean));
  return ratio.numel() ? ratio.max().item<double>() : 0.0;
}

}  // namespace

void add_expert_load(StepMetrics& m, const at::Tensor& counts, int64_t expert_ranks) {
  const at::Tensor c = counts.to(at::kCPU, at::kDouble);
  const int64_t layers = c.size(0), experts = c.size(1);
  const at::Tensor per_rank = c.view({layers, expert_ranks, experts / expert_ranks}).sum(2);  // [layers, ranks]
  const at::Tensor total = per_rank.sum(0).to(at::kLong);
  m.expert_tokens.assign(total.data_ptr<int64_t>(), total.data_ptr<int64_t>() + expert_ranks);
  m.expert_imbalance = worst_ratio(per_rank);
  m.hot_expert = worst_ratio(c);
}

}  // namespace mmsp::train
