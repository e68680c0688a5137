// TokenLayout checks and the block schedule; see token_layout.h. The schedule
// works on runs (maximal stretches of one segment) so it costs O(runs) per block
// pair, and is exact: a block is skipped only if the mask empties it.
#include "mmsp/attention/token_layout.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "mmsp/core/check.h"

namespace mmsp::attention {
namespace {

struct Run {
  int64_t segment, min_order, max_order;
};

// Runs of non-padding tokens in [begin, end), merged per segment.
std::vector<Run> runs_of(const int64_t* seg, const int64_t* ord, int64_t begin, int64_t end) {
  std::vector<Run> runs;
  for (int64_t i = begin; i < end; ++i) {
    if (seg[i] < 0) continue;
    if (!runs.empty() && runs.back().segment == seg[i]) {
      runs.back().min_order = std::min(runs.back().min_order, ord[i]);
      runs.back().max_order = std::max(runs.back().max_order, ord[i]);
    } else {
      runs.push_back({seg[i], ord[i], ord[i]});
    }
  }
  return runs;
}

}  // namespace

void TokenLayout::check(const char* what) const {
  MMSP_CHECK(segment.defined() && order.defined(), what, ": token layout needs segment and order");
  MMSP_CHECK(segment.dim() == 1 && order.dim() == 1 && segment.size(0) == order.size(0), what, ": segment ",
             segment.sizes(), " and order ", order.sizes(), " must be 1-D of the same length");
  MMSP_CHECK(segment.scalar_type() == at::kLong && order.scalar_type() == at::kLong, what,
             ": segment and order must be int64, got ", segment.scalar_type(), " and ", order.scalar_type());
  MMSP_CHECK(segment.is_cpu() && order.is_cpu(), what, ": the token layout is plan metadata and must be on the CPU");
}

TokenLayout TokenLayout::slice(int64_t begin, int64_t length) const {
  return {segment.narrow(0, begin, length), order.narrow(0, begin, length)};
}

TokenLayout TokenLayout::concat(const std::vector<TokenLayout>& parts) {
  std::vector<at::Tensor> segs, ords;
  for (const auto& p : parts) segs.push_back(p.segment), ords.push_back(p.order);
  return {at::cat(segs), at::cat(ords)};
}

BlockSchedule BlockSchedule::make(const TokenLayout& q, const TokenLayout& k, bool causal, int64_t block_q,
                                  int64_t block_k) {
  MMSP_CHECK(block_q > 0 && block_k > 0, "attention block sizes must be positive, got ", block_q, " and ", block_k);
  at::Tensor qs = q.segment.contiguous(), qo = q.order.contiguous();
  at::Tensor ks = k.segment.contiguous(), ko = k.order.contiguous();
  const int64_t *qseg = qs.data_ptr<int64_t>(), *qord = qo.data_ptr<int64_t>();
  const int64_t *kseg = ks.data_ptr<int64_t>(), *kord = ko.data_ptr<int64_t>();
  const int64_t Tq = q.size(), Tk = k.size();

  std::vector<std::vector<Run>> k_runs;
  for (int64_t j = 0; j < Tk; j += block_k) k_runs.push_back(runs_of(kseg, kord, j, std::min(Tk, j + block_k)));

  BlockSchedule schedule;
  schedule.block_q = block_q;
  schedule.block_k = block_k;
  for (int64_t i = 0; i < Tq; i += block_q) {
    const int64_t i_end = std::min(Tq, i + block_q);
    std::vector<Run> q_runs = runs_of(qseg, qord, i, i_end);
    const bool q_has_pad = static_cast<int64_t>(q_runs.size()) == 0 ||
                           std::any_of(qseg + i, qseg + i_end, [](int64_t s) { return s < 0; });
    std::vector<KeyBlock> blocks;
    for (size_t b = 0; b < k_runs.size(); ++b) {
      const int64_t j = static_cast<int64_t>(b) * block_k, j_end = std::min(Tk, j + block_k);
      bool any = false;
      for (const Run& qr : q_runs)
        for (const Run& kr : k_runs[b]) any |= qr.segment == kr.segment && (!causal || kr.min_order <= qr.max_order);
      if (!any) continue;
      const bool k_has_pad = std::any_of(kseg + j, kseg + j_end, [](int64_t s) { return s < 0; });
      const bool one_segment = q_runs.size() == 1 && k_runs[b].size() == 1 && q_runs[0].segment == k_runs[b][0].segment;
      const bool full =
          one_segment && !q_has_pad && !k_has_pad && (!causal || k_runs[b][0].max_order <= q_runs[0].min_order);
      if (!full) {
        // Trim the block to its first and last key that some query attends: on
        // the causal diagonal this halves the work of the block.
        auto wanted = [&](int64_t key) {
          for (const Run& qr : q_runs)
            if (kseg[key] == qr.segment && (!causal || kord[key] <= qr.max_order)) return true;
          return false;
        };
        int64_t first = j, last = j_end - 1;
        while (!wanted(first)) ++first;
        while (!wanted(last)) --last;
        blocks.push_back({first, last + 1, false});
        continue;
      }
      blocks.push_back({j, j_end, full});
    }
    schedule.key_blocks.push_back(std::move(blocks));
  }
  return schedule;
}

int64_t allowed_pairs(const TokenLayout& q, const TokenLayout& k, bool causal) {
  // Per segment, count keys with order <= each query's order (sorted keys).
  std::map<int64_t, std::vector<int64_t>> keys;
  at::Tensor ks = k.segment.contiguous(), ko = k.order.contiguous();
  for (int64_t j = 0; j < k.size(); ++j)
    if (ks.data_ptr<int64_t>()[j] >= 0) keys[ks.data_ptr<int64_t>()[j]].push_back(ko.data_ptr<int64_t>()[j]);
  for (auto& [s, v] : keys) std::sort(v.begin(), v.end());
  at::Tensor qs = q.segment.contiguous(), qo = q.order.contiguous();
  int64_t pairs = 0;
  for (int64_t i = 0; i < q.size(); ++i) {
    auto it = keys.find(qs.data_ptr<int64_t>()[i]);
    if (qs.data_ptr<int64_t>()[i] < 0 || it == keys.end()) continue;
    const auto& v = it->second;
    pairs += causal ? std::upper_bound(v.begin(), v.end(), qo.data_ptr<int64_t>()[i]) - v.begin()
                    : static_cast<int64_t>(v.size());
  }
  return pairs;
}

}  // namespace mmsp::attention
