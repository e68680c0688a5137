// The locality pass of Vision DP: more placeholder rows stay on the rank that encodes
// them, and the largest load never grows.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "mmsp/plan/vision_assignment.h"

using namespace mmsp::plan;

namespace {

int64_t rows_home(const std::vector<int>& encoder_of, const std::vector<HeldRows>& held) {
  int64_t home = 0;
  for (size_t i = 0; i < held.size(); ++i)
    for (const auto& [r, rows] : held[i])
      if (r == encoder_of[i]) home += rows;
  return home;
}

}  // namespace

TEST(KeepRowsHome, SwapsEqualItemsHome) {
  const std::vector<double> costs(4, 10.0);
  const std::vector<HeldRows> held = {{{0, 8}}, {{0, 8}}, {{1, 8}}, {{1, 5}, {0, 3}}};
  VisionAssignment a = evaluate_assignment({1, 1, 0, 0}, costs, 2);  // everything away
  keep_rows_home(a, costs, held, 2, VisionCostModel{});
  EXPECT_EQ(a.rank_of_item, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_DOUBLE_EQ(*std::max_element(a.load.begin(), a.load.end()), 20.0);
}

TEST(KeepRowsHome, MovesIntoSpareRoomButNeverAboveTheLargestLoad) {
  // Rank 1 has room for item 0 (load 10 vs top 30); rank 2 has none.
  const std::vector<double> costs = {10, 20, 10, 20};
  const std::vector<HeldRows> held = {{{1, 4}}, {{2, 9}}, {{0, 1}}, {{2, 1}}};
  VisionAssignment a = evaluate_assignment({0, 0, 1, 2}, costs, 3);  // loads 30, 10, 20
  keep_rows_home(a, costs, held, 3, VisionCostModel{});
  EXPECT_EQ(a.rank_of_item[0], 1);
  EXPECT_LE(*std::max_element(a.load.begin(), a.load.end()), 30.0);
}

TEST(KeepRowsHome, RandomInstancesKeepMoreHomeAndNeverRaiseTheMax) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int ranks = 1 + trial % 8, n = 1 + static_cast<int>(rng() % 40);
    std::vector<double> costs(n);
    std::vector<HeldRows> held(n);
    std::vector<int> start(n);
    for (int i = 0; i < n; ++i) {
      costs[i] = trial % 3 == 0 ? 10.0 : 1 + rng() % 50;
      for (int r = 0; r < ranks; ++r)
        if (rng() % 3 == 0) held[i].push_back({r, 1 + static_cast<int64_t>(rng() % 20)});
      start[i] = static_cast<int>(rng() % ranks);
    }
    VisionAssignment a = evaluate_assignment(start, costs, ranks);
    const double top = *std::max_element(a.load.begin(), a.load.end());
    const int64_t before = rows_home(start, held);
    keep_rows_home(a, costs, held, ranks, VisionCostModel{});
    ASSERT_EQ(a.rank_of_item.size(), static_cast<size_t>(n));
    for (int r : a.rank_of_item) ASSERT_TRUE(r >= 0 && r < ranks);
    EXPECT_LE(*std::max_element(a.load.begin(), a.load.end()), top * (1 + 1e-9)) << "trial " << trial;
    EXPECT_GE(rows_home(a.rank_of_item, held), before) << "trial " << trial;
  }
}
