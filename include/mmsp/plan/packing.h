// Packing: the sequences of one dp rank laid end to end in one row (THD), each split
// segment padded at its end to a multiple of 2 x ring so zigzag chunks are equal (a segment
// held whole by one rank is not padded); and the assignment of sequences to dp ranks.
// Sharding the row is shard_map's job, choosing which segments stay whole placement's.
#pragma once

#include <cstdint>
#include <vector>

namespace mmsp::plan {

struct Segment {
  int64_t sequence = 0;       // index in the batch
  int64_t start = 0;          // first packed index
  int64_t length = 0;         // real tokens
  int64_t padded_length = 0;  // split: length rounded up to a multiple of 2 x ring; whole: length
  int home = -1;              // context rank holding it whole (adaptive placement); -1: split
};

struct PackedRow {
  std::vector<Segment> segments;
  std::vector<int64_t> cu_seqlens;  // padded segment boundaries, segments.size() + 1 entries
  int64_t length = 0;               // padded tokens in the row
  int64_t real_tokens = 0;
};

// Packs the given sequences (batch indices, with their lengths) in order. home: the
// placement's context rank per sequence (-1 split); empty: every segment split (zigzag).
// Checks the row fits int32 (cu_seqlens of the attention kernel).
PackedRow pack_row(const std::vector<int64_t>& sequences, const std::vector<int64_t>& lengths, int ring,
                   const std::vector<int>& home = {});

// Sequences of each dp rank, in batch order within a rank: longest first to the
// least-loaded rank (ties to the lower rank), so rows are balanced and deterministic.
std::vector<std::vector<int64_t>> assign_sequences_to_dp(const std::vector<int64_t>& lengths, int dp);

}  // namespace mmsp::plan
