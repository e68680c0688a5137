// Shard map of one packed row over a context group of ring x ulysses ranks: which
// packed token each local slot holds, and where each packed token lives.
// zigzag: ring rank r holds chunks r and 2R-1-r of every segment (in segment order), its
// share split contiguously over its U ulysses ranks, padded to a multiple of U.
// contiguous: the row padded to a multiple of R*U and cut into R*U equal pieces.
#pragma once

#include <cstdint>
#include <vector>

#include "mmsp/plan/mesh.h"
#include "mmsp/plan/packing.h"

namespace mmsp::plan {

// Consecutive local slots that hold consecutive packed tokens of one segment.
struct SlotRun {
  int64_t slot = 0;      // first local slot
  int64_t packed = -1;   // first packed index; -1 for tail padding (no segment)
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
  int64_t share_length_ = 0;  // tokens of one ring rank (before ulysses padding)
  int64_t local_length_ = 0;
};

}  // namespace mmsp::plan
