// Zigzag and contiguous shard maps of a packed row, and their inverse.
#include "mmsp/plan/shard_map.h"

#include <algorithm>

#include "mmsp/core/check.h"

namespace mmsp::plan {

ShardMap::ShardMap(const PackedRow& row, int ring, int ulysses, Layout layout)
    : row_(row), ring_(ring), ulysses_(ulysses), layout_(layout) {
  MMSP_CHECK(ring >= 1 && ulysses >= 1, "ring (", ring, ") and ulysses (", ulysses,
             ") must be >= 1");
  const int64_t R = ring, U = ulysses;
  if (layout == Layout::zigzag) {
    for (const Segment& s : row_.segments)
      MMSP_ASSERT(s.padded_length % (2 * R) == 0, "segment of ", s.padded_length,
                  " tokens is not padded to a multiple of 2 x ring = ", 2 * R);
    share_length_ = row_.length / R;
    local_length_ = (share_length_ + U - 1) / U;
  } else {
    local_length_ = (row_.length + R * U - 1) / (R * U);
    share_length_ = local_length_ * U;
  }
}

int32_t ShardMap::segment_of(int64_t p) const {
  const auto& cu = row_.cu_seqlens;
  auto it = std::upper_bound(cu.begin(), cu.end(), p);
  return static_cast<int32_t>(it - cu.begin()) - 1;
}

SlotLocation ShardMap::locate(int64_t p) const {
  MMSP_ASSERT(p >= 0 && p < row_.length, "packed index ", p, " outside a row of ", row_.length);
  SlotLocation loc;
  const int64_t L = local_length_;
  if (layout_ == Layout::contiguous) {
    loc.context_rank = static_cast<int>(p / L);
    loc.slot = p % L;
    loc.contiguous = std::min(L - loc.slot, row_.length - p);
    return loc;
  }
  const int64_t R = ring_;
  const int32_t s = segment_of(p);
  const int64_t seg_start = row_.cu_seqlens[s];
  const int64_t c = row_.segments[s].padded_length / (2 * R);
  const int64_t off = p - seg_start;
  const int64_t k = off / c;
  const int64_t within = off - k * c;
  const bool first_half = k < R;
  const int64_t r = first_half ? k : 2 * R - 1 - k;
  const int64_t share_pos = seg_start / R + (first_half ? 0 : c) + within;
  const int64_t u = share_pos / L;
  loc.slot = share_pos - u * L;
  loc.context_rank = static_cast<int>(r * ulysses_ + u);
  loc.contiguous = std::min(c - within, L - loc.slot);
  return loc;
}

std::vector<SlotRun> ShardMap::runs(int context_rank) const {
  MMSP_ASSERT(context_rank >= 0 && context_rank < ring_ * ulysses_);
  const int64_t L = local_length_;
  std::vector<SlotRun> out;
  int64_t filled = 0;
  const auto& cu = row_.cu_seqlens;
  const int64_t nseg = static_cast<int64_t>(row_.segments.size());
  out.reserve(layout_ == Layout::zigzag ? static_cast<size_t>(2 * nseg + 1) : 8);
  auto emit = [&](int64_t packed, int64_t length, int64_t s) {
    SlotRun run;
    run.slot = filled;
    run.packed = packed;
    run.length = length;
    run.segment = static_cast<int32_t>(s);
    run.index = packed - cu[s];
    out.push_back(run);
    filled += length;
  };
  if (layout_ == Layout::contiguous) {
    const int64_t lo = context_rank * L, hi = std::min(lo + L, row_.length);
    if (lo < hi) {
      for (int64_t s = segment_of(lo); s < nseg && cu[s] < hi; ++s) {
        const int64_t a = std::max(cu[s], lo), b = std::min(cu[s + 1], hi);
        emit(a, b - a, s);
      }
    }
  } else {
    const int64_t R = ring_;
    const int64_t r = context_rank / ulysses_, u = context_rank % ulysses_;
    const int64_t lo = u * L, hi = std::min(lo + L, share_length_);
    if (lo < hi) {
      // First segment whose share range [cu[s]/R, cu[s+1]/R) ends after lo.
      int64_t s = static_cast<int64_t>(std::upper_bound(cu.begin(), cu.end(), lo * R) - cu.begin()) - 1;
      for (; s < nseg && cu[s] / R < hi; ++s) {
        const int64_t c = row_.segments[s].padded_length / (2 * R);
        for (int half = 0; half < 2; ++half) {
          const int64_t a = cu[s] / R + half * c;  // share range [a, a + c)
          const int64_t x = std::max(a, lo), y = std::min(a + c, hi);
          if (x >= y) continue;
          const int64_t chunk = half == 0 ? r : 2 * R - 1 - r;
          emit(cu[s] + chunk * c + (x - a), y - x, s);
        }
      }
    }
  }
  if (filled < L) {
    SlotRun tail;
    tail.slot = filled;
    tail.length = L - filled;
    out.push_back(tail);
  }
  return out;
}

std::vector<int64_t> ShardMap::tokens(int context_rank) const {
  std::vector<int64_t> out(local_length_, -1);
  for (const SlotRun& run : runs(context_rank)) {
    if (run.segment < 0) continue;
    const int64_t real = std::min(run.length, row_.segments[run.segment].length - run.index);
    for (int64_t k = 0; k < real; ++k) out[run.slot + k] = run.packed + k;
  }
  return out;
}

}  // namespace mmsp::plan
