// Placement of a packed row's segments over a context group (ring x ulysses ranks):
// zigzag splits every segment over the whole group; adaptive keeps a segment whole on one
// context rank (no padding, no attention communication) unless it is too long to balance,
// and splits only those, zigzag over the ring as before. The rule and its cost model are in
// docs/plan.md ("Placement"); shard_map lays the decision out in slots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mmsp::plan {

enum class Placement { zigzag, adaptive };
Placement parse_placement(const std::string& name);
const char* to_string(Placement placement);

// The balance adaptive must reach; it splits the fewest longest segments that reach it.
struct PlacementOptions {
  double max_padding = 0.01;     // slots beyond the real tokens, as a fraction of them
  double max_work_ratio = 1.05;  // causal pairs: most loaded context rank over the mean
};

// Causal (query, key) pairs of the queries at indices [begin, end) of one segment: a query at
// index i sees keys 0..i, so sum over i of (i + 1). 0 when end <= begin.
double causal_pairs(int64_t begin, int64_t end);

// Pairs ring rank r computes of a segment of `length` real tokens padded to `padded`
// (a multiple of 2 x ring) under zigzag: its chunks r and 2R-1-r.
double zigzag_pairs(int64_t length, int64_t padded, int ring, int ring_rank);

// Split tokens per ulysses rank of one ring rank: `share` split tokens over U ranks already
// holding whole[u] tokens each, filled in ulysses order up to the lowest common level so that
// the ranks' totals are as even as the share allows (all zero whole tokens: zigzag's
// contiguous ceil(share / U) split).
std::vector<int64_t> split_share_counts(int64_t share, const std::vector<int64_t>& whole);

// Context rank holding each segment whole, or -1 where it is split over the group (zigzag:
// every segment). lengths are the real tokens of the row's segments in packed order.
std::vector<int> place_segments(const std::vector<int64_t>& lengths, int ring, int ulysses, Placement placement,
                                const PlacementOptions& options = {});

}  // namespace mmsp::plan
