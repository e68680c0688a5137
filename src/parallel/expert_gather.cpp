// The whole model from each rank's experts; see expert_gather.h.
#include "mmsp/parallel/expert_gather.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/shard_collectives.h"
#include "mmsp/model/layers/expert_names.h"

namespace mmsp::parallel {
namespace {

// Every rank's `t` (same shape on each), in rank order: [ranks, ...t's shape].
at::Tensor gather_one(const at::Tensor& t, dist::Group& group) {
  const at::Tensor shard = t.detach().contiguous().view({-1});
  at::Tensor flat = at::empty({shard.numel() * group.size()}, shard.options());
  dist::all_gather_into(shard, flat, group);
  std::vector<int64_t> shape = t.sizes().vec();
  shape.insert(shape.begin(), group.size());
  return flat.view(shape);
}

}  // namespace

model::NamedParams gather_experts(const model::NamedParams& local, const model::MoeConfig& moe,
                                  const dist::GroupPtr& experts) {
  if (!experts || experts->size() == 1) return local;
  const int64_t ranks = experts->size(), per_rank = moe.local_experts(), first = moe.first_local_expert();
  model::NamedParams out;
  for (size_t i = 0; i < local.size();) {
    if (!model::is_expert_parameter(local[i].first)) {
      out.push_back(local[i++]);
      continue;
    }
    // One layer's experts: a run of expert parameters (its router before, the rest after).
    size_t end = i;
    while (end < local.size() && model::is_expert_parameter(local[end].first)) ++end;
    std::vector<at::Tensor> every;  // [parameter of the run] -> [ranks, ...]
    for (size_t k = i; k < end; ++k) every.push_back(gather_one(local[k].second, *experts));
    if (moe.layout == model::ExpertLayout::fused) {
      for (size_t k = i; k < end; ++k) out.emplace_back(local[k].first, every[k - i].flatten(0, 1));
    } else {
      for (int64_t r = 0; r < ranks; ++r)
        for (size_t k = i; k < end; ++k) {
          const int64_t e = model::expert_index(local[k].first);
          MMSP_ASSERT(e >= first && e < first + per_rank, local[k].first, " is not one of this rank's experts");
          out.emplace_back(model::with_expert_index(local[k].first, e - first + r * per_rank), every[k - i][r]);
        }
    }
    i = end;
  }
  return out;
}

}  // namespace mmsp::parallel
