// Packing and shard maps: golden layouts, and random rows over meshes up to 8 wide.
#include "mmsp/plan/shard_map.h"

#include <numeric>

#include "plan_test_util.h"

namespace mmsp::plan {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
using V = std::vector<int64_t>;

TEST(Packing, PadsEachSegmentToTwiceRing) {
  const PackedRow row = pack_row({4, 9}, {5, 3}, 2);
  ASSERT_EQ(row.segments.size(), 2u);
  EXPECT_EQ(row.segments[0].sequence, 4);
  EXPECT_EQ(row.segments[0].padded_length, 8);
  EXPECT_EQ(row.segments[1].start, 8);
  EXPECT_EQ(row.segments[1].padded_length, 4);
  EXPECT_EQ(row.cu_seqlens, (V{0, 8, 12}));
  EXPECT_EQ(row.length, 12);
  EXPECT_EQ(row.real_tokens, 8);
}

TEST(Packing, Int32Limit) {
  EXPECT_THAT(error_of([] {
                pack_row({0, 1}, {int64_t{1} << 30, int64_t{1} << 30}, 1);
              }),
              HasSubstr("packed row holds 2147483648 tokens after sequence 1"));
  EXPECT_NO_THROW(pack_row({0}, {int64_t{1} << 30}, 1));
}

TEST(Packing, DpAssignmentBalancedAndComplete) {
  const auto groups = assign_sequences_to_dp({10, 50, 20, 30, 40}, 2);
  // longest first to the lighter rank: 50->0, 40->1, 30->1, 20->0, 10->0 (tie: lower rank)
  EXPECT_EQ(groups[0], (V{0, 1, 2}));
  EXPECT_EQ(groups[1], (V{3, 4}));
  EXPECT_THAT(error_of([] { assign_sequences_to_dp({3, 4}, 3); }), HasSubstr("batch has 2 sequences but dp is 3"));
  EXPECT_THAT(error_of([] { assign_sequences_to_dp({}, 1); }), HasSubstr("batch is empty"));
}

TEST(ShardMapGolden, ZigzagRingTwo) {
  const PackedRow row = pack_row({0, 1}, {5, 3}, 2);  // cu [0, 8, 12]
  const ShardMap m(row, 2, 1, Layout::zigzag);
  EXPECT_EQ(m.local_length(), 6);
  EXPECT_EQ(m.tokens(0), (V{0, 1, -1, -1, 8, -1}));  // chunks 0,3 of each segment
  EXPECT_EQ(m.tokens(1), (V{2, 3, 4, -1, 9, 10}));   // chunks 1,2
}

TEST(ShardMapGolden, ZigzagRingTwoUlyssesTwo) {
  const PackedRow row = pack_row({0, 1}, {5, 3}, 2);
  const ShardMap m(row, 2, 2, Layout::zigzag);
  EXPECT_EQ(m.local_length(), 3);
  EXPECT_EQ(m.tokens(0), (V{0, 1, -1}));
  EXPECT_EQ(m.tokens(1), (V{-1, 8, -1}));
  EXPECT_EQ(m.tokens(2), (V{2, 3, 4}));
  EXPECT_EQ(m.tokens(3), (V{-1, 9, 10}));
  const SlotLocation loc = m.locate(9);
  EXPECT_EQ(loc.context_rank, 3);
  EXPECT_EQ(loc.slot, 1);
}

TEST(ShardMapGolden, ContiguousAndTailPadding) {
  const PackedRow row = pack_row({0, 1}, {5, 3}, 2);
  const ShardMap m(row, 2, 2, Layout::contiguous);
  EXPECT_EQ(m.tokens(0), (V{0, 1, 2}));
  EXPECT_EQ(m.tokens(1), (V{3, 4, -1}));
  EXPECT_EQ(m.tokens(2), (V{-1, -1, 8}));
  EXPECT_EQ(m.tokens(3), (V{9, 10, -1}));
  // Ulysses padding: a share of 4 tokens over U = 3 -> 2 slots each; rank 2 is all tail padding.
  const PackedRow one = pack_row({0}, {3}, 1);  // padded to 2 x ring = 2: 4 tokens
  const ShardMap z(one, 1, 3, Layout::zigzag);
  EXPECT_EQ(z.local_length(), 2);
  const auto runs = z.runs(2);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].segment, -1);
  EXPECT_EQ(runs[0].length, 2);
}

// Every real token held exactly once, pads never; locate() is the inverse of tokens().
TEST(ShardMapProperty, RandomRowsAllMeshes) {
  std::mt19937 rng(11);
  int layouts = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    const int ring = std::uniform_int_distribution<int>(1, 8)(rng);
    const int ulysses = std::uniform_int_distribution<int>(1, 8 / ring)(rng);
    const Layout layout = trial % 3 == 0 ? Layout::contiguous : Layout::zigzag;
    const int nseg = std::uniform_int_distribution<int>(1, 5)(rng);
    V seqs(nseg), lens(nseg);
    for (int i = 0; i < nseg; ++i) {
      seqs[i] = i;
      lens[i] = std::uniform_int_distribution<int64_t>(1, 200)(rng);
    }
    const PackedRow row = pack_row(seqs, lens, ring);
    const ShardMap m(row, ring, ulysses, layout);
    const int S = ring * ulysses;
    V held(row.length, 0);
    for (int c = 0; c < S; ++c) {
      const V tokens = m.tokens(c);
      ASSERT_EQ(static_cast<int64_t>(tokens.size()), m.local_length());
      int64_t slot = 0;
      for (const SlotRun& run : m.runs(c)) {
        ASSERT_EQ(run.slot, slot);
        slot += run.length;
        for (int64_t k = 0; k < run.length && run.segment >= 0; ++k) {
          const int64_t p = run.packed + k;
          ASSERT_EQ(m.segment_of(p), run.segment);
          ASSERT_EQ(p - row.cu_seqlens[run.segment], run.index + k);
          const SlotLocation loc = m.locate(p);  // pads too: every packed index has a home
          ASSERT_EQ(loc.context_rank, c);
          ASSERT_EQ(loc.slot, run.slot + k);
          ASSERT_GE(loc.contiguous, 1);
          ++held[p];
        }
      }
      ASSERT_EQ(slot, m.local_length());
      for (int64_t s = 0; s < m.local_length(); ++s) {
        const int64_t p = tokens[s];
        if (p < 0) continue;
        const int32_t seg = m.segment_of(p);
        ASSERT_LT(p - row.cu_seqlens[seg], row.segments[seg].length) << "pad slot marked real";
      }
    }
    for (int64_t p = 0; p < row.length; ++p) ASSERT_EQ(held[p], 1) << "packed " << p;
    // contiguous hint: the next `contiguous` tokens really are on consecutive slots
    for (int probe = 0; probe < 5; ++probe) {
      const int64_t p = std::uniform_int_distribution<int64_t>(0, row.length - 1)(rng);
      const SlotLocation a = m.locate(p);
      for (int64_t k = 1; k < a.contiguous; ++k) {
        const SlotLocation b = m.locate(p + k);
        ASSERT_EQ(b.context_rank, a.context_rank);
        ASSERT_EQ(b.slot, a.slot + k);
      }
    }
    ++layouts;
  }
  EXPECT_EQ(layouts, 1500);
}

// Causal work per rank from the shard map alone: sum over held real tokens of (index + 1),
// summed over a ring rank's U ranks (ulysses shares heads, not queries).
std::vector<double> ring_pairs(const PackedRow& row, const ShardMap& m) {
  std::vector<double> pairs(m.ring(), 0.0);
  for (int c = 0; c < m.ring() * m.ulysses(); ++c)
    for (int64_t p : m.tokens(c))
      if (p >= 0) pairs[c / m.ulysses()] += static_cast<double>(p - row.cu_seqlens[m.segment_of(p)] + 1);
  return pairs;
}

double max_over_mean_of(const std::vector<double>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  return *std::max_element(v.begin(), v.end()) / mean;
}

TEST(ShardMapProperty, ZigzagCausalWorkWithinTwoPercentOnLongSegments) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    const int ring = std::uniform_int_distribution<int>(2, 8)(rng);
    const int ulysses = std::uniform_int_distribution<int>(1, 8 / ring)(rng);
    const int nseg = std::uniform_int_distribution<int>(1, 4)(rng);
    V seqs(nseg), lens(nseg);
    for (int i = 0; i < nseg; ++i) {
      seqs[i] = i;
      lens[i] = std::uniform_int_distribution<int64_t>(4000, 12000)(rng);
    }
    const PackedRow row = pack_row(seqs, lens, ring);
    const ShardMap zig(row, ring, ulysses, Layout::zigzag);
    EXPECT_LT(max_over_mean_of(ring_pairs(row, zig)), 1.02) << "ring " << ring << " trial " << trial;
    if (ring >= 4 && nseg == 1) {  // the comparison layout is far off: the check can fail
      const ShardMap flat(row, ring, ulysses, Layout::contiguous);
      EXPECT_GT(max_over_mean_of(ring_pairs(row, flat)), 1.5);
    }
  }
}

}  // namespace
}  // namespace mmsp::plan
