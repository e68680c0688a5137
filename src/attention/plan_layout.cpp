// Plan -> attention layouts; see plan_layout.h.
#include "mmsp/attention/plan_layout.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace mmsp::attention {
namespace {

TokenLayout from_vectors(const std::vector<int64_t>& seg, const std::vector<int64_t>& ord) {
  return {at::tensor(at::ArrayRef<int64_t>(seg), at::kLong).clone(),
          at::tensor(at::ArrayRef<int64_t>(ord), at::kLong).clone()};
}

}  // namespace

TokenLayout local_layout(const plan::ShardMap& shards, int context_rank) {
  std::vector<int64_t> seg, ord;
  const auto& segments = shards.row().segments;
  for (const plan::SlotRun& run : shards.runs(context_rank))
    for (int64_t i = 0; i < run.length; ++i) {
      const bool real = run.segment >= 0 && run.index + i < segments[run.segment].length;
      seg.push_back(real ? run.segment : -1);
      ord.push_back(run.segment >= 0 ? run.index + i : 0);
    }
  return from_vectors(seg, ord);
}

std::vector<TokenLayout> ring_shares(const plan::ShardMap& shards) {
  std::vector<TokenLayout> shares;
  for (int r = 0; r < shards.ring(); ++r) {
    std::vector<TokenLayout> parts;
    for (int u = 0; u < shards.ulysses(); ++u) parts.push_back(local_layout(shards, r * shards.ulysses() + u));
    shares.push_back(TokenLayout::concat(parts));
  }
  return shares;
}

std::vector<int64_t> split_slots(const plan::ShardMap& shards) {
  const auto& segments = shards.row().segments;
  std::vector<int64_t> counts;
  if (std::none_of(segments.begin(), segments.end(), [](const plan::Segment& s) { return s.home >= 0; })) return counts;
  for (int c = 0; c < shards.ring() * shards.ulysses(); ++c) counts.push_back(shards.split_slots(c));
  return counts;
}

TokenLayout row_layout(const plan::PackedRow& row) {
  std::vector<int64_t> seg(row.length, -1), ord(row.length, 0);
  for (size_t s = 0; s < row.segments.size(); ++s) {
    const plan::Segment& segment = row.segments[s];
    for (int64_t i = 0; i < segment.padded_length; ++i) {
      seg[segment.start + i] = i < segment.length ? static_cast<int64_t>(s) : -1;
      ord[segment.start + i] = i;
    }
  }
  return from_vectors(seg, ord);
}

}  // namespace mmsp::attention
