// Positions: golden values derived by hand from transformers' get_rope_index rules per
// family, and random sequences against the per-token reference loop.
#include "mmsp/plan/mrope_positions.h"

#include "plan_test_util.h"

namespace mmsp::plan {
namespace {

using testing::reference_positions;
using testing::SeqBuilder;
using V = std::vector<int64_t>;

const ModelConventions kQwen2 = testing::released("qwen2_vl");
const ModelConventions kQwen25 = testing::released("qwen2_5_vl");  // tokens_per_second 2
const ModelConventions kQwen3 = testing::released("qwen3_vl");
const ModelConventions kLlava = testing::released("llava");

std::vector<V> positions_of(const Sequence& s, const ModelConventions& c, int64_t* delta = nullptr) {
  const SequencePositions p = make_sequence_positions(parse_sequence(s, c, 0), s, c);
  const int64_t n = p.length();
  std::vector<V> rows(p.rows(), V(n));
  int64_t* out[3] = {nullptr, nullptr, nullptr};
  for (int r = 0; r < p.rows(); ++r) out[r] = rows[r].data();
  p.fill(0, n, out);
  if (delta) *delta = p.rope_delta();
  return rows;
}

TEST(PositionsGolden, Qwen2VLImageBetweenText) {
  // T T <vs> [4 pads: grid 1x4x4, merge 2 -> 2x2] <ve> T T
  const Sequence s = SeqBuilder(kQwen2).text(2).image({1, 4, 4}).text(2).build();
  int64_t delta = 0;
  const auto p = positions_of(s, kQwen2, &delta);
  EXPECT_EQ(p[0], (V{0, 1, 2, 3, 3, 3, 3, 5, 6, 7}));
  EXPECT_EQ(p[1], (V{0, 1, 2, 3, 3, 4, 4, 5, 6, 7}));
  EXPECT_EQ(p[2], (V{0, 1, 2, 3, 4, 3, 4, 5, 6, 7}));
  EXPECT_EQ(delta, 8 - 10);
}

TEST(PositionsGolden, Qwen2VLVideoFramesAdvanceT) {
  // T <vs> [grid 2x4x4 -> 2 frames of 2x2] <ve> T
  const Sequence s = SeqBuilder(kQwen2).text(1).video({2, 4, 4}).text(1).build();
  int64_t delta = 0;
  const auto p = positions_of(s, kQwen2, &delta);
  EXPECT_EQ(p[0], (V{0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 5}));
  EXPECT_EQ(p[1], (V{0, 1, 2, 2, 3, 3, 2, 2, 3, 3, 4, 5}));
  EXPECT_EQ(p[2], (V{0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5}));
  EXPECT_EQ(delta, 6 - 12);
}

TEST(PositionsGolden, Qwen2_5VLTemporalScaling) {
  // second_per_grid_t 1.0 x tokens_per_second 2: frame f -> t index 2f.
  const Sequence s = SeqBuilder(kQwen25).text(1).video({2, 4, 4}, 1.0).text(1).build();
  int64_t delta = 0;
  const auto p = positions_of(s, kQwen25, &delta);
  EXPECT_EQ(p[0], (V{0, 1, 2, 2, 2, 2, 4, 4, 4, 4, 5, 6}));
  EXPECT_EQ(p[1], (V{0, 1, 2, 2, 3, 3, 2, 2, 3, 3, 5, 6}));
  EXPECT_EQ(delta, 7 - 12);
  // 0.75 s x 2: t index int(0), int(1.5), int(3.0) = 0, 1, 3 (truncation, as .long()).
  const Sequence f = SeqBuilder(kQwen25).video({3, 2, 2}, 0.75).build();
  const auto q = positions_of(f, kQwen25);
  EXPECT_EQ(q[0], (V{0, 1, 2, 4, 5}));
  EXPECT_EQ(q[1], (V{0, 1, 1, 1, 5}));
  // No second_per_grid_ts: 1.0 per video; images always t index 0.
  const Sequence g = SeqBuilder(kQwen25).video({2, 2, 2}).image({2, 2, 2}).build();
  const auto r = positions_of(g, kQwen25);
  EXPECT_EQ(r[0], (V{0, 1, 3, 4, 5, 6, 6, 7}));
}

TEST(PositionsGolden, Qwen3VLEachFrameItsOwnBlock) {
  // T, then per frame: 3 timestamp tokens, <vs>, 4 pads, <ve>. Every frame has t index 0.
  const Sequence s = SeqBuilder(kQwen3).text(1).video({2, 4, 4}).build();
  int64_t delta = 0;
  const auto p = positions_of(s, kQwen3, &delta);
  EXPECT_EQ(p[0], (V{0, 1, 2, 3, 4, 5, 5, 5, 5, 7, 8, 9, 10, 11, 12, 12, 12, 12, 14}));
  EXPECT_EQ(p[1], (V{0, 1, 2, 3, 4, 5, 5, 6, 6, 7, 8, 9, 10, 11, 12, 12, 13, 13, 14}));
  EXPECT_EQ(p[2], (V{0, 1, 2, 3, 4, 5, 6, 5, 6, 7, 8, 9, 10, 11, 12, 13, 12, 13, 14}));
  EXPECT_EQ(delta, 15 - 19);
}

TEST(PositionsGolden, TextOnlyAndOneDimensional) {
  int64_t delta = 5;
  const auto p = positions_of(SeqBuilder(kQwen2).text(4).build(), kQwen2, &delta);
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(p[2], (V{0, 1, 2, 3}));
  EXPECT_EQ(delta, 0);
  const auto l = positions_of(SeqBuilder(kLlava).text(2).image({1, 2, 2}).text(1).build(), kLlava, &delta);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0], (V{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(delta, 0);
}

TEST(PositionsGolden, ImageFirstThenImageAdjacent) {
  // <vs>[2x3]<ve><vs>[1x1]<ve>: the second block starts after the first's max.
  const Sequence s = SeqBuilder(kQwen2).image({1, 4, 6}).image({1, 2, 2}).build();
  const auto p = positions_of(s, kQwen2);
  EXPECT_EQ(p[0], (V{0, 1, 1, 1, 1, 1, 1, 4, 5, 6, 7}));
  EXPECT_EQ(p[1], (V{0, 1, 1, 1, 2, 2, 2, 4, 5, 6, 7}));
  EXPECT_EQ(p[2], (V{0, 1, 2, 3, 1, 2, 3, 4, 5, 6, 7}));
}

// Random sequences of each family against the reference loop, over random sub-ranges.
TEST(PositionsProperty, MatchesReferenceOnRandomSequences) {
  std::mt19937 rng(7);
  const ModelConventions families[] = {kQwen2, kQwen25, kQwen3, kLlava, testing::released("internvl")};
  for (int trial = 0; trial < 1500; ++trial) {
    const ModelConventions& c = families[trial % 5];
    SeqBuilder b(c, trial);
    const bool with_secs = c.scales_video_time() && trial % 2 == 0;
    const int items = std::uniform_int_distribution<int>(0, 4)(rng);
    b.text(std::uniform_int_distribution<int>(0, 5)(rng));
    for (int k = 0; k < items; ++k) {
      const int64_t m = c.spatial_merge_size;
      Grid g{std::uniform_int_distribution<int64_t>(1, 3)(rng), m * std::uniform_int_distribution<int64_t>(1, 4)(rng),
             m * std::uniform_int_distribution<int64_t>(1, 4)(rng)};
      // Qwen3-VL: some videos as transformers 5.x writes them, the template's markers around.
      if (c.supports_video() && rng() % 2) {
        if (c.video_frames_as_blocks() && rng() % 2)
          b.wrapped_video(g);
        else
          b.video(g, with_secs ? 0.25 * (rng() % 9) : -1);
      } else {
        b.image(g);
      }
      b.text(std::uniform_int_distribution<int>(0, 4)(rng));
    }
    Sequence s = b.build();
    if (s.input_ids.empty()) s.input_ids.push_back(11);
    if (!with_secs) s.second_per_grid_ts.clear();
    const auto ref = reference_positions(s, c);
    const SequencePositions p = make_sequence_positions(parse_sequence(s, c, 0), s, c);
    ASSERT_EQ(p.rope_delta(), ref.delta) << "trial " << trial;
    const int64_t n = p.length();
    const int64_t a = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
    const int64_t len = std::uniform_int_distribution<int64_t>(0, n - a)(rng);
    std::vector<V> rows(p.rows(), V(len));
    int64_t* out[3] = {nullptr, nullptr, nullptr};
    for (int r = 0; r < p.rows(); ++r) out[r] = rows[r].data();
    p.fill(a, len, out);
    for (int r = 0; r < p.rows(); ++r)
      for (int64_t i = 0; i < len; ++i)
        ASSERT_EQ(rows[r][i], ref.rows[r][a + i]) << "trial " << trial << " row " << r << " token " << a + i;
  }
}

}  // namespace
}  // namespace mmsp::plan
