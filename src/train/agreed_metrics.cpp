// One step's figures as every rank agrees on them; see agreed_metrics.h.
#include "agreed_metrics.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "mmsp/dist/all_reduce.h"

namespace mmsp::train {
namespace {

// The loss summed over the world, and each figure of every rank ([figure][rank]).
struct Reduced {
  double loss = 0;
  std::vector<std::vector<double>> per_rank;
  double max(size_t figure) const { return *std::max_element(per_rank[figure].begin(), per_rank[figure].end()); }
};
// The loss and the summed figures (`sums`, replaced by their world sums) travel with
// every rank's own figures in one all-reduce.
Reduced reduce_metrics(double local_loss, std::map<std::string, double>& sums, const std::vector<double>& mine,
                       const dist::Mesh& mesh) {
  const int64_t n = static_cast<int64_t>(mine.size()), world = mesh.world_size();
  const int64_t s = 1 + static_cast<int64_t>(sums.size());
  at::Tensor buffer = at::zeros({s + n * world}, at::kDouble);
  buffer[0] = local_loss;
  int64_t k = 1;
  for (const auto& [name, value] : sums) buffer[k++] = value;
  for (int64_t i = 0; i < n; ++i) buffer[s + i * world + mesh.rank()] = mine[i];
  dist::all_reduce_(buffer, *mesh.world());
  Reduced r;
  r.loss = buffer[0].item<double>();
  const double* p = buffer.data_ptr<double>();
  k = 1;
  for (auto& [name, value] : sums) value = p[k++];
  for (int64_t i = 0; i < n; ++i) r.per_rank.emplace_back(p + s + i * world, p + s + (i + 1) * world);
  return r;
}

}  // namespace

StepMetrics agreed_metrics(int64_t step, double local_loss, std::map<std::string, double> objective, double lr,
                           double grad_norm, const plan::Batch& batch, const plan::StepPlan& plan, const StepAccount& a,
                           const dist::Mesh& mesh) {
  // Byte counts travel as doubles: exact below 2^53.
  const Reduced r = reduce_metrics(
      local_loss, objective,
      {a.seconds, a.phases.vision_s, a.phases.attention_s, a.phases.communication_s, static_cast<double>(a.peak_bytes),
       static_cast<double>(a.sent.total()), static_cast<double>(a.sent.attention), static_cast<double>(a.sent.vision),
       static_cast<double>(a.sent.grad), static_cast<double>(a.update_peak_bytes),
       static_cast<double>(a.forward_peak_bytes), static_cast<double>(a.backward_peak_bytes),
       static_cast<double>(a.sent.experts)},
      mesh);
  StepMetrics m;
  m.step = step;
  m.loss = r.loss;
  m.objective = std::move(objective);
  m.lr = lr;
  m.grad_norm = grad_norm;
  for (const auto& s : batch.sequences) {
    const double n = static_cast<double>(s.input_ids.size());
    m.tokens += static_cast<int64_t>(s.input_ids.size());
    m.attention_pairs += 0.5 * n * (n + 1);
  }
  m.label_tokens = plan.label_count;
  const auto& times = r.per_rank[0];
  const size_t slowest = std::max_element(times.begin(), times.end()) - times.begin();
  m.seconds = times[slowest];
  m.vision_s = r.per_rank[1][slowest];
  m.attention_s = r.per_rank[2][slowest];
  m.communication_s = r.per_rank[3][slowest];
  m.other_s = std::max(0.0, m.seconds - m.vision_s - m.attention_s - m.communication_s);
  m.peak_bytes = static_cast<int64_t>(r.max(4));
  m.update_peak_bytes = static_cast<int64_t>(r.max(9));
  m.forward_peak_bytes = static_cast<int64_t>(r.max(10));
  m.backward_peak_bytes = static_cast<int64_t>(r.max(11));
  // The busiest sender's bytes and their parts, so the parts add up to comm_bytes
  // (first such rank on a tie), as the time split is the slowest rank's.
  const auto& sent_by = r.per_rank[5];
  const size_t busiest = std::max_element(sent_by.begin(), sent_by.end()) - sent_by.begin();
  m.comm_bytes = static_cast<int64_t>(sent_by[busiest]);
  m.attention_bytes = static_cast<int64_t>(r.per_rank[6][busiest]);
  m.vision_bytes = static_cast<int64_t>(r.per_rank[7][busiest]);
  m.grad_bytes = static_cast<int64_t>(r.per_rank[8][busiest]);
  m.expert_bytes = static_cast<int64_t>(r.per_rank[12][busiest]);
  return m;
}

}  // namespace mmsp::train
