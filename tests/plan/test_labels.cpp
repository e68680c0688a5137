// Labels: shifted within the sequence, placeholders / loss_mask / last token ignored.
#include "mmsp/plan/labels.h"

#include "plan_test_util.h"

namespace mmsp::plan {
namespace {

using testing::SeqBuilder;
using V = std::vector<int64_t>;

TEST(LabelsGolden, QwenImageAndMask) {
  const ModelConventions c = testing::released("qwen2_vl");
  Sequence s;
  // 5 6 <vs> P P <ve> 7 8 ; grid 1x2x4 -> 2 rows
  s.input_ids = {5, 6, 151652, 151655, 151655, 151653, 7, 8};
  s.image_grid_thw = {{1, 2, 4}};
  V out(8);
  fill_labels(s, c, 0, 8, out.data());
  EXPECT_EQ(out, (V{6, 151652, -100, -100, 151653, 7, 8, -100}));
  EXPECT_EQ(count_labels(s, c), 5);
  s.loss_mask = {1, 1, 1, 1, 1, 1, 0, 1};  // token 7 is not a target
  fill_labels(s, c, 0, 8, out.data());
  EXPECT_EQ(out, (V{6, 151652, -100, -100, 151653, -100, 8, -100}));
  EXPECT_EQ(count_labels(s, c), 4);
  V mid(3);
  fill_labels(s, c, 5, 3, mid.data());  // a shard in the middle sees the same labels
  EXPECT_EQ(mid, (V{-100, 8, -100}));
}

TEST(LabelsGolden, LlavaAndInternVLPlaceholders) {
  const ModelConventions l = testing::released("llava");
  Sequence s;
  s.input_ids = {1, 32000, 32000, 2};
  V out(4);
  fill_labels(s, l, 0, 4, out.data());
  EXPECT_EQ(out, (V{-100, -100, 2, -100}));
  const ModelConventions i = testing::released("internvl");
  s.input_ids = {1, 151665, 151667, 151666, 2};
  V o2(5);
  fill_labels(s, i, 0, 5, o2.data());
  EXPECT_EQ(o2, (V{151665, -100, 151666, 2, -100}));
}

TEST(LabelsProperty, EqualShiftingTheUnshardedRow) {
  std::mt19937 rng(3);
  const ModelConventions c = testing::released("qwen3_vl");
  for (int trial = 0; trial < 300; ++trial) {
    SeqBuilder b(c, trial);
    b.text(1 + rng() % 5).image({1, 4, 4}).text(rng() % 4).video({2, 2, 4}).text(rng() % 3);
    b.mask_first(rng() % 10);
    const Sequence s = b.build();
    const V ref = testing::reference_labels(s, c);
    const int64_t n = static_cast<int64_t>(s.input_ids.size());
    const int64_t a = rng() % n, len = rng() % (n - a + 1);
    V out(len);
    fill_labels(s, c, a, len, out.data());
    for (int64_t k = 0; k < len; ++k) ASSERT_EQ(out[k], ref[a + k]);
    int64_t kept = 0;
    for (int64_t v : ref) kept += v != -100;
    ASSERT_EQ(count_labels(s, c), kept);
    ASSERT_EQ(count_labels(s, parse_sequence(s, c, 0), c), kept);
    Sequence unmasked = s;
    unmasked.loss_mask.clear();
    int64_t kept_unmasked = 0;
    for (int64_t v : testing::reference_labels(unmasked, c)) kept_unmasked += v != -100;
    ASSERT_EQ(count_labels(unmasked, parse_sequence(unmasked, c, 0), c), kept_unmasked);
  }
}

}  // namespace
}  // namespace mmsp::plan
