// Zigzag (with whole segments where the placement keeps them) and contiguous shard maps of a
// packed row, and their inverse; see shard_map.h.
#include "mmsp/plan/shard_map.h"

#include <algorithm>

#include "mmsp/core/check.h"
#include "mmsp/plan/placement.h"

namespace mmsp::plan {

ShardMap::ShardMap(const PackedRow& row, int ring, int ulysses, Layout layout)
    : row_(row), ring_(ring), ulysses_(ulysses), layout_(layout) {
  MMSP_CHECK(ring >= 1 && ulysses >= 1, "ring (", ring, ") and ulysses (", ulysses, ") must be >= 1");
  const int64_t R = ring, U = ulysses, S = R * U;
  if (layout == Layout::contiguous) {
    for (const Segment& s : row_.segments)
      MMSP_CHECK(s.home < 0, "layout contiguous cuts the row into equal pieces; a segment held whole (", "sequence ",
                 s.sequence, " on context rank ", s.home, ") needs layout zigzag");
    local_length_ = (row_.length + S - 1) / S;
    share_length_ = local_length_ * U;
    return;
  }
  const int64_t nseg = static_cast<int64_t>(row_.segments.size());
  offset_.assign(nseg, 0);
  whole_.assign(S, {});
  std::vector<int64_t> whole_tokens(S, 0);
  for (int64_t i = 0; i < nseg; ++i) {
    const Segment& s = row_.segments[i];
    if (s.home >= 0) {
      MMSP_ASSERT(s.home < S, "segment ", i, " held by context rank ", s.home, " of ", S);
      whole_[s.home].push_back(static_cast<int32_t>(i));
      offset_[i] = whole_tokens[s.home];  // relative to the rank's split slots, fixed below
      whole_tokens[s.home] += s.padded_length;
      continue;
    }
    MMSP_ASSERT(s.padded_length % (2 * R) == 0, "segment of ", s.padded_length,
                " tokens is not padded to a multiple of 2 x ring = ", 2 * R);
    offset_[i] = share_length_;
    split_segments_.push_back(i);
    split_starts_.push_back(share_length_);
    share_length_ += s.padded_length / R;
  }
  split_begin_.assign(S, 0);
  split_count_.assign(S, 0);
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<int64_t> mine(whole_tokens.begin() + r * U, whole_tokens.begin() + (r + 1) * U);
    const std::vector<int64_t> counts = split_share_counts(share_length_, mine);
    int64_t begin = 0;
    for (int64_t u = 0; u < U; ++u) {
      split_begin_[r * U + u] = begin;
      split_count_[r * U + u] = counts[u];
      begin += counts[u];
      local_length_ = std::max(local_length_, counts[u] + mine[u]);
    }
  }
  for (int64_t i = 0; i < nseg; ++i)
    if (row_.segments[i].home >= 0) offset_[i] += split_count_[row_.segments[i].home];
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
  const int32_t s = segment_of(p);
  const int64_t seg_start = row_.cu_seqlens[s];
  const int64_t off = p - seg_start;
  const Segment& segment = row_.segments[s];
  if (segment.home >= 0) {
    loc.context_rank = segment.home;
    loc.slot = offset_[s] + off;
    loc.contiguous = segment.padded_length - off;
    return loc;
  }
  const int64_t R = ring_;
  const int64_t c = segment.padded_length / (2 * R);
  const int64_t k = off / c;
  const int64_t within = off - k * c;
  const bool first_half = k < R;
  const int64_t r = first_half ? k : 2 * R - 1 - k;
  const int64_t share_pos = offset_[s] + (first_half ? 0 : c) + within;
  // The ulysses rank whose split range holds share_pos: the last one starting at or before it
  // (ranks with no split slots start where the next one does).
  const auto first = split_begin_.begin() + r * ulysses_;
  const int64_t u = (std::upper_bound(first, first + ulysses_, share_pos) - first) - 1;
  const int64_t cr = r * ulysses_ + u;
  loc.slot = share_pos - split_begin_[cr];
  loc.context_rank = static_cast<int>(cr);
  loc.contiguous = std::min(c - within, split_count_[cr] - loc.slot);
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
    const int64_t r = context_rank / ulysses_;
    const int64_t lo = split_begin_[context_rank], hi = lo + split_count_[context_rank];
    if (lo < hi) {
      // First split segment whose share range [start, start + P/R) ends after lo.
      size_t k = static_cast<size_t>(std::upper_bound(split_starts_.begin(), split_starts_.end(), lo) -
                                     split_starts_.begin()) -
                 1;
      for (; k < split_segments_.size() && split_starts_[k] < hi; ++k) {
        const int64_t s = split_segments_[k];
        const int64_t c = row_.segments[s].padded_length / (2 * R);
        for (int half = 0; half < 2; ++half) {
          const int64_t a = split_starts_[k] + half * c;  // share range [a, a + c)
          const int64_t x = std::max(a, lo), y = std::min(a + c, hi);
          if (x >= y) continue;
          const int64_t chunk = half == 0 ? r : 2 * R - 1 - r;
          emit(cu[s] + chunk * c + (x - a), y - x, s);
        }
      }
    }
    for (const int32_t s : whole_[context_rank]) emit(cu[s], row_.segments[s].padded_length, s);
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
