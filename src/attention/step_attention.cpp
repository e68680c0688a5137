// The step's attention, planned once; see step_attention.h.
#include "mmsp/attention/step_attention.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

#include "mmsp/attention/ulysses_attention.h"
#include "mmsp/core/check.h"

namespace mmsp::attention {
namespace {

// The split counts of a mixed placement against the shares: in range, the same split
// share on every ring rank (the ring's hops are of one size), and no segment held whole on
// one rank with tokens anywhere else — its keys would never be exchanged, so a wrong count
// would drop them silently.
void check_split_slots(const std::vector<TokenLayout>& shares, const std::vector<int64_t>& split, int U, int64_t L) {
  const int R = static_cast<int>(shares.size());
  MMSP_CHECK(static_cast<int>(split.size()) == R * U, "context_attention: ", split.size(),
             " split-slot counts given for a context group of ", R, " x ", U, " ranks");
  std::vector<int64_t> share(R, 0);
  for (int c = 0; c < R * U; ++c) {
    MMSP_CHECK(split[c] >= 0 && split[c] <= L, "context_attention: context rank ", c, " has ", split[c],
               " split slots of its ", L);
    share[c / U] += split[c];
  }
  for (int r = 1; r < R; ++r)
    MMSP_CHECK(share[r] == share[0], "context_attention: ring rank ", r, " holds ", share[r],
               " split tokens but ring rank 0 holds ", share[0], "; every ring rank must hold the same number");
  std::map<int64_t, int> home;  // segment -> the one context rank holding it, or -1: split
  auto claim = [&](int64_t segment, int owner, int c) {
    auto [it, fresh] = home.emplace(segment, owner);
    MMSP_CHECK(fresh || (it->second == owner && owner >= 0) || (it->second < 0 && owner < 0),
               "context_attention: segment ", segment, " is held whole on context rank ", std::max(owner, it->second),
               " but has tokens elsewhere too (context rank ", c, ")");
  };
  for (int c = 0; c < R * U; ++c) {
    const at::Tensor seg = shares[c / U].segment.narrow(0, (c % U) * L, L).contiguous();
    const int64_t* s = seg.data_ptr<int64_t>();
    for (int64_t i = 0; i < L; ++i)  // once per run of one segment on one side of the split
      if (s[i] >= 0 && (i == 0 || i == split[c] || s[i] != s[i - 1])) claim(s[i], i < split[c] ? -1 : c, c);
  }
}

}  // namespace

std::vector<TokenLayout> split_shares(const std::vector<TokenLayout>& shares, const std::vector<int64_t>& split,
                                      int U) {
  const int64_t L = shares.at(0).size() / U;
  std::vector<TokenLayout> out;
  for (size_t r = 0; r < shares.size(); ++r) {
    std::vector<TokenLayout> parts;
    for (int u = 0; u < U; ++u) parts.push_back(shares[r].slice(u * L, split.at(r * U + u)));
    out.push_back(TokenLayout::concat(parts));
  }
  return out;
}

TokenLayout whole_slots(const std::vector<TokenLayout>& shares, const std::vector<int64_t>& split, int U, int r,
                        int u) {
  const int64_t L = shares.at(0).size() / U, a = split.at(r * U + u);
  return shares.at(r).slice(u * L + a, L - a);
}

std::shared_ptr<const StepAttention> plan_step_attention(const ContextGroups& groups,
                                                         std::vector<TokenLayout> ring_shares,
                                                         const AttentionOptions& options, const at::Device& device,
                                                         std::optional<LinearAttentionShape> linear,
                                                         std::vector<int64_t> split_slots) {
  const int R = groups.ring->size(), U = groups.ulysses->size();
  MMSP_CHECK(static_cast<int>(ring_shares.size()) == R, "context_attention: ", ring_shares.size(),
             " ring shares given for a ring of ", R, " ranks");
  auto step = std::make_shared<StepAttention>();
  step->groups = groups;
  step->options = options;
  const int r = groups.ring->rank(), u = groups.ulysses->rank();
  auto plan_linear = [&](const std::vector<TokenLayout>& shares, int ring_rank) {
    return std::make_shared<const RingRunIndex>(
        RingRunIndex::make(shares, ring_rank, linear->conv_kernel, linear->chunk, device));
  };
  if (split_slots.empty()) {
    step->kernels = plan_ring_kernels(ring_shares, r, options, device);
    if (linear) step->linear = plan_linear(ring_shares, r);
  } else {
    for (const TokenLayout& share : ring_shares) share.check("context_attention");
    const int64_t L = ring_shares[0].size() / U;
    for (int p = 0; p < R; ++p)
      MMSP_CHECK(ring_shares[p].size() == L * U, "context_attention: ring rank ", p, " holds ", ring_shares[p].size(),
                 " slots, not ", U, " ulysses ranks x ", L);
    check_split_slots(ring_shares, split_slots, U, L);
    const std::vector<TokenLayout> split = split_shares(ring_shares, split_slots, U);
    if (split[0].size() > 0) {
      step->kernels = plan_ring_kernels(split, r, options, device);
      if (linear) step->linear = plan_linear(split, r);
    }
    if (split_slots[r * U + u] < L) {
      const TokenLayout whole = whole_slots(ring_shares, split_slots, U, r, u);
      step->whole = plan_kernel(whole, whole, options, device);
      if (linear) step->linear_whole = plan_linear({whole}, 0);  // every run starts its segment
    }
    step->split_slots = std::move(split_slots);
  }
  step->ring_shares = std::move(ring_shares);
  return step;
}

}  // namespace mmsp::attention
