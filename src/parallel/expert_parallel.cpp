// A mixture-of-experts layer's tokens to their experts' ranks and back; see expert_parallel.h.
#include "mmsp/parallel/expert_parallel.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_to_all_v.h"

namespace mmsp::parallel {
namespace {

// Rows per rank of counts laid out [rank][local expert].
std::vector<int64_t> per_rank(const std::vector<int64_t>& counts, int64_t ranks) {
  const int64_t local = static_cast<int64_t>(counts.size()) / ranks;
  std::vector<int64_t> out(ranks, 0);
  for (int64_t r = 0; r < ranks; ++r)
    for (int64_t j = 0; j < local; ++j) out[r] += counts[r * local + j];
  return out;
}

}  // namespace

model::ExpertExchange expert_exchange(const dist::GroupPtr& group) {
  model::ExpertExchange exchange;
  if (!group || group->size() == 1) return exchange;
  exchange.ranks = group->size();
  exchange.run = [group](const at::Tensor& rows, const std::vector<int64_t>& counts,
                         const model::LocalExperts& experts) {
    const int64_t ranks = group->size();
    MMSP_ASSERT(static_cast<int64_t>(counts.size()) % ranks == 0, counts.size(), " expert counts for ", ranks,
                " ranks");
    const int64_t local = static_cast<int64_t>(counts.size()) / ranks;
    // [rank][local expert] counts out, [source][local expert] in: every rank sends each
    // rank its `local` counts, whatever they are.
    const at::Tensor sent = at::tensor(at::ArrayRef<int64_t>(counts), at::kLong).view({ranks * local, 1});
    const std::vector<int64_t> each(ranks, local);
    const at::Tensor got = dist::detail::all_to_all_v_raw(sent, each, each, *group, dist::Pass::forward).view({-1});
    const std::vector<int64_t> received(got.data_ptr<int64_t>(), got.data_ptr<int64_t>() + ranks * local);
    const std::vector<int64_t> send_rows = per_rank(counts, ranks), recv_rows = per_rank(received, ranks);
    const at::Tensor arrived = dist::all_to_all_v(rows, send_rows, recv_rows, group);
    return dist::all_to_all_v(experts(arrived, received), recv_rows, send_rows, group);
  };
  return exchange;
}

int64_t expert_exchange_bytes(int64_t tokens, int64_t top_k, int64_t hidden, int64_t element_bytes, int64_t experts,
                              int ranks) {
  if (ranks <= 1) return 0;
  const int64_t rows = 2 * tokens * top_k * (ranks - 1) / ranks;
  return rows * hidden * element_bytes + 8 * (ranks - 1) * (experts / ranks);
}

}  // namespace mmsp::parallel
