// Shard map of one packed row over a context group of ring x ulysses ranks: which
// packed token each local slot holds, and where each packed token lives.
// zigzag: ring rank r holds chunks r and 2R-1-r of every split segment (in segment order),
// that share split contiguously over its U ulysses ranks; a segment the placement keeps
// whole (Segment::home >= 0) follows on its home rank in segment order, unpadded; every
// rank is padded at its tail to the group's largest. With no whole segment each ulysses
// rank takes ceil(share / U) of the share, as zigzag always has.
// contiguous: the row padded to a multiple of R*U and cut into R*U equal pieces.
#pragma once

#include <cstdint>
#include <vector>

#include "mmsp/plan/mesh.h"
#include "mmsp/plan/packing.h"

namespace mmsp::plan {

// Consecutive local slots that hold consecutive packed tokens of one segment.
struct SlotRun {
  int64_t slot = 0;     // first local slot
  int64_t packed = -1;  // first packed index; -1 for tail padding (no segment)
  int64_t length = 0;
  int32_t segment = -1;  // segment of the row; -1 for tail padding
  int64_t index = -1;    // index within the padded segment of the first token
};

struct SlotLocation {
  int context_rank = 0;
  int64_t slot = 0;
  int64_t contiguous = 0;  // packed tokens from here on that stay on this rank in consecutive slots
};

class ShardMap {
 public:
  ShardMap() = default;
  ShardMap(const PackedRow& row, int ring, int ulysses, Layout layout);

  int ring() const { return ring_; }
  int ulysses() const { return ulysses_; }
  Layout layout() const { return layout_; }
  int64_t local_length() const { return local_length_; }  // slots per rank, equal on every rank
  // Split tokens (with their zigzag padding) a context rank holds, at its first slots.
  int64_t split_slots(int context_rank) const { return split_count_.empty() ? 0 : split_count_[context_rank]; }
  const PackedRow& row() const { return row_; }

  // Runs of a rank's slots in slot order, covering all local_length() slots.
  std::vector<SlotRun> runs(int context_rank) const;
  // Packed index of each slot of a rank; -1 for padding (segment padding and tail).
  std::vector<int64_t> tokens(int context_rank) const;
  // Inverse: where packed index p (0 <= p < row.length) lives.
  SlotLocation locate(int64_t packed) const;
  int32_t segment_of(int64_t packed) const;

 private:
  PackedRow row_;  // its own copy, so a ShardMap can be stored and moved freely
  int ring_ = 1, ulysses_ = 1;
  Layout layout_ = Layout::zigzag;
  int64_t share_length_ = 0;  // split tokens of one ring rank (before ulysses padding)
  int64_t local_length_ = 0;
  // zigzag: per context rank, where its split slots start in its ring rank's share and how
  // many; per segment, its offset in the share (split) or its first slot on its home (whole);
  // per context rank, its whole segments in order.
  std::vector<int64_t> split_begin_, split_count_;
  std::vector<int64_t> offset_;
  std::vector<int64_t> split_segments_, split_starts_;  // split segments in order, share offsets
  std::vector<std::vector<int32_t>> whole_;
};

}  // namespace mmsp::plan
