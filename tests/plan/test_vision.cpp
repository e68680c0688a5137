// Vision DP assignment: the Python patches' greedy rule reproduced on its known cases,
// and ours never worse than it on random batches.
#include "mmsp/plan/vision_assignment.h"

#include <iostream>

#include "plan_test_util.h"

namespace mmsp::plan {
namespace {

using V = std::vector<int64_t>;

TEST(GreedyContiguous, KnownCasesFromThePythonPatches) {
  EXPECT_EQ(assign_greedy_contiguous({10, 20, 30, 40, 50}, 2), (std::vector<int>{0, 0, 0, 0, 1}));
  EXPECT_EQ(assign_greedy_contiguous({500, 100, 100, 100}, 2), (std::vector<int>{0, 1, 1, 1}));
  // fewer images than ranks: the leading ranks are the empty ones
  EXPECT_EQ(assign_greedy_contiguous({100, 200}, 4), (std::vector<int>{2, 3}));
  EXPECT_TRUE(assign_greedy_contiguous({}, 3).empty());
}

TEST(EncoderPatches, Int32PerRank) {
  const V patches{int64_t{1} << 30, int64_t{1} << 30, 5};
  EXPECT_NO_THROW(check_encoder_patches(patches, {0, 1, 1}, 2, 0));
  EXPECT_THAT(testing::error_of([&] {
                check_encoder_patches(patches, {1, 1, 0}, 2, 3);
              }),
              ::testing::HasSubstr("dp row 3: context rank 1 would encode 2147483648 patches"));
}

TEST(EncoderCost, PatchesPlusQuadraticAttention) {
  VisionCostModel m;
  m.attention_weight = 0.5;
  // 2 frames of 3x4 = 12 patches: 24 + 0.5 * 2 * 144
  EXPECT_DOUBLE_EQ(encoder_cost({2, 3, 4}, m), 24 + 144.0);
}

TEST(Balanced, NearTiesGoToTheHoldingRank) {
  VisionCostModel m;
  const std::vector<double> costs{10, 10, 10, 10};
  const V patches{10, 10, 10, 10};
  const auto a = assign_vision_balanced(costs, patches, {1, 1, 0, 0}, 2, m);
  EXPECT_EQ(a.rank_of_item, (std::vector<int>{1, 1, 0, 0}));
  EXPECT_DOUBLE_EQ(a.max_over_mean, 1.0);
  // Without preference, largest-first to the lightest rank.
  const auto b = assign_vision_balanced(costs, patches, {-1, -1, -1, -1}, 2, m);
  EXPECT_EQ(b.rank_of_item, (std::vector<int>{0, 1, 0, 1}));
}

TEST(Balanced, BeatsLargestFirstWhereContiguousIsOptimal) {
  // LPT alone gives 7 vs 5; the optimum (and the greedy rule) gives 6 / 6.
  VisionCostModel m;
  const std::vector<double> costs{3, 3, 2, 2, 2};
  const auto a = assign_vision_balanced(costs, {3, 3, 2, 2, 2}, {-1, -1, -1, -1, -1}, 2, m);
  EXPECT_DOUBLE_EQ(*std::max_element(a.load.begin(), a.load.end()), 6.0);
}

TEST(Balanced, RandomBatchesNeverWorseThanGreedy) {
  std::mt19937 rng(17);
  VisionCostModel m;
  double ours_sum = 0, greedy_sum = 0, ours_worst = 1, greedy_worst = 1;
  int cases = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int ranks = std::uniform_int_distribution<int>(1, 8)(rng);
    const int n = std::uniform_int_distribution<int>(0, 40)(rng);
    std::vector<double> costs(n);
    V patches(n);
    std::vector<int> preferred(n);
    for (int i = 0; i < n; ++i) {
      // images from 8x8 to 64x64 patches, some multi-frame videos
      const int64_t h = 2 * std::uniform_int_distribution<int64_t>(4, 32)(rng);
      const int64_t w = 2 * std::uniform_int_distribution<int64_t>(4, 32)(rng);
      const int64_t t = rng() % 4 == 0 ? std::uniform_int_distribution<int64_t>(2, 8)(rng) : 1;
      costs[i] = encoder_cost({t, h, w}, m);
      patches[i] = t * h * w;
      preferred[i] = static_cast<int>(rng() % ranks);
    }
    const VisionAssignment ours = assign_vision_balanced(costs, patches, preferred, ranks, m);
    const VisionAssignment greedy = evaluate_assignment(assign_greedy_contiguous(patches, ranks), costs, ranks);
    ASSERT_EQ(ours.rank_of_item.size(), static_cast<size_t>(n));
    for (int r : ours.rank_of_item) ASSERT_TRUE(r >= 0 && r < ranks);
    double total = 0;
    for (double l : ours.load) total += l;
    double expect_total = 0;
    for (double c : costs) expect_total += c;
    ASSERT_NEAR(total, expect_total, 1e-6 * (1 + expect_total));
    ASSERT_LE(ours.max_over_mean, greedy.max_over_mean + 1e-9) << "trial " << trial;
    if (n >= 2 * ranks && ranks > 1) {
      ours_sum += ours.max_over_mean;
      greedy_sum += greedy.max_over_mean;
      ours_worst = std::max(ours_worst, ours.max_over_mean);
      greedy_worst = std::max(greedy_worst, greedy.max_over_mean);
      ++cases;
    }
  }
  ASSERT_GT(cases, 100);
  // Printed for docs/plan.md: mean and worst max/mean over the random batches.
  std::cout << "[vision-dp] " << cases << " batches with >= 2 items per rank: ours mean " << ours_sum / cases
            << " worst " << ours_worst << "; greedy contiguous mean " << greedy_sum / cases << " worst " << greedy_worst
            << "\n";
  EXPECT_LT(ours_sum / cases, greedy_sum / cases);
}

}  // namespace
}  // namespace mmsp::plan
