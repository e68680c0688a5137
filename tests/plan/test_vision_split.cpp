// Vision-tower SP in the planner: the flag's spelling, which items split and why others
// stay whole, each rank's rows of a split item, and the routes that bring every row of
// a plan mixing split and whole items to its placeholder exactly once.
#include "mmsp/plan/step_plan.h"
#include "mmsp/plan/vision_split.h"

#include <map>

#include "plan_test_util.h"

namespace mmsp::plan {
namespace {

using testing::error_of;

TEST(VisionSplitFlag, OffAutoOrAPatchCount) {
  EXPECT_EQ(parse_vision_split("off").mode, VisionSplitOptions::Mode::off);
  EXPECT_EQ(parse_vision_split("auto").mode, VisionSplitOptions::Mode::automatic);
  const VisionSplitOptions forced = parse_vision_split("4096");
  EXPECT_EQ(forced.mode, VisionSplitOptions::Mode::forced);
  EXPECT_EQ(forced.min_patches, 4096);
  EXPECT_EQ(to_string(forced), "4096");
  for (const char* bad : {"0", "-3", "x", "", "1e3", "99999999999999999999"})
    EXPECT_THAT(error_of([&] { parse_vision_split(bad); }),
                ::testing::HasSubstr(std::string("--vision-split \"") + bad + "\" must be off, auto or a patch count"))
        << bad;
}

TEST(VisionSplit, ShardsAreWholeRowsAsEvenAsTheyGo) {
  EXPECT_EQ(shard_boundaries(15, 4), (std::vector<int64_t>{0, 4, 8, 12, 15}));
  EXPECT_EQ(shard_boundaries(3, 3), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(shard_boundaries(7, 1), (std::vector<int64_t>{0, 7}));
}

TEST(VisionSplit, ReasonsAnItemStaysWhole) {
  VisionItem item;
  item.rows = 2;
  ModelConventions qwen;
  qwen.vision_heads = 16;
  EXPECT_THAT(unsplittable_reason(item, 3, qwen),
              ::testing::HasSubstr("16 attention heads do not divide by the context group's 3 ranks"));
  EXPECT_THAT(unsplittable_reason(item, 4, qwen),
              ::testing::HasSubstr("it has 2 merge windows (embedding rows), fewer than the context group's 4 ranks"));
  EXPECT_EQ(unsplittable_reason(item, 2, qwen), "");
  ModelConventions none;
  EXPECT_THAT(unsplittable_reason(item, 2, none), ::testing::HasSubstr("encodes items whole"));
  // InternVL: whole tiles, any number of ranks up to the tiles
  ModelConventions tiles;
  tiles.vision_split_by_frames = true;
  VisionItem tiled;
  tiled.grid = {5, 16, 16};
  tiled.rows = 5 * 64;
  EXPECT_EQ(unsplittable_reason(tiled, 3, tiles), "");
  EXPECT_EQ(split_unit_rows(tiled, tiles), 64);
  EXPECT_EQ(split_item_rows(tiled, 3, tiles), (std::vector<int64_t>{0, 128, 256, 320}));
  EXPECT_THAT(unsplittable_reason(tiled, 6, tiles),
              ::testing::HasSubstr("it has 5 tiles (frames), fewer than the context group's 6 ranks"));
}

// Every rank's routes: each placeholder slot of the row receives exactly one row, every
// sent row is received by the rank it names, and no rank reads past its encoder output.
void expect_routes_cover(const Batch& batch, const StepPlan& plan) {
  const int S = plan.options.mesh.context();
  std::vector<RankRoutes> routes;
  for (int r = 0; r < S; ++r) routes.push_back(make_rank_plan(batch, plan, r).routes);
  int64_t rows = 0, received = 0;
  for (const VisionItem& it : plan.rows[0].items) rows += it.rows;
  std::map<std::pair<int64_t, int64_t>, int> seen;  // (item, row) -> times received
  for (int dst = 0; dst < S; ++dst)
    for (int src = 0; src < S; ++src) {
      const auto& in = routes[dst].recv[src];
      const auto& out = routes[src].send[dst];
      ASSERT_EQ(in.size(), out.size()) << src << " -> " << dst;
      for (size_t k = 0; k < in.size(); ++k) {
        EXPECT_EQ(in[k].item, out[k].item);
        EXPECT_EQ(in[k].row, out[k].row);
        EXPECT_EQ(in[k].src_row, out[k].src_row);
        EXPECT_LT(out[k].src_row, routes[src].encoder_rows) << "rank " << src;
        ++seen[{in[k].item, in[k].row}];
        ++received;
      }
    }
  EXPECT_EQ(received, rows);
  for (const auto& [where, times] : seen) EXPECT_EQ(times, 1) << "item " << where.first << " row " << where.second;
}

// One 4K-page-sized image (128 × 128 patches, 4,096 rows) and twelve small ones on a ring
// of 4: no assignment of whole items balances that, and the automatic rule splits the
// page alone; the busiest rank's encoder cost is then within 10 % of the mean.
TEST(VisionSplit, AutomaticSplitsTheGiantAndBalancesTheRest) {
  ModelConventions c = testing::released("qwen2_vl");
  ASSERT_EQ(c.vision_heads, 16);  // Qwen2-VL's released tower
  Batch batch;
  batch.sequences.push_back(testing::SeqBuilder(c, 1).text(5).image({1, 128, 128}).text(7).build());
  for (int i = 0; i < 12; ++i)
    batch.sequences.push_back(testing::SeqBuilder(c, 2 + i).text(3).image({1, 32, 32}).text(4).build());
  PlanOptions options;
  options.mesh = {1, 4, 1};
  const StepPlan whole = make_step_plan(batch, c, options, 0);
  EXPECT_EQ(whole.rows[0].load.split_items, 0);
  EXPECT_GT(whole.rows[0].load.vision_ratio, 2.0);  // the page on one rank
  options.vision_split = parse_vision_split("auto");
  const StepPlan p = make_step_plan(batch, c, options, 0);
  int split = 0;
  for (const VisionItem& it : p.rows[0].items) {
    split += it.split();
    if (it.split()) {
      EXPECT_EQ(it.patches, 128 * 128);
      EXPECT_EQ(it.shard_rows, (std::vector<int64_t>{0, 1024, 2048, 3072, 4096}));
      EXPECT_EQ(it.encoder_rank, -1);
    }
  }
  EXPECT_EQ(split, 1);
  EXPECT_EQ(p.rows[0].load.split_items, 1);
  EXPECT_LE(p.rows[0].load.vision_ratio, 1.1);
  expect_routes_cover(batch, p);
}

// --vision-split 16 on 3 ranks: heads that divide by 3 split every item of 16+ patches,
// an item of 2 rows stays whole (fewer rows than ranks); 16 heads split nothing on 3.
TEST(VisionSplit, ForcedSplitsWhatCanBeSplitAndKeepsTheRestWhole) {
  ModelConventions c = testing::released("qwen2_vl");
  Batch batch;
  batch.sequences.push_back(testing::SeqBuilder(c, 1).text(5).image({1, 6, 10}).text(3).image({1, 2, 4}).build());
  batch.sequences.push_back(testing::SeqBuilder(c, 2).text(4).video({2, 4, 4}).text(6).build());
  PlanOptions options;
  options.mesh = {1, 3, 1};
  options.vision_split = parse_vision_split("8");
  c.vision_heads = 12;
  const StepPlan p = make_step_plan(batch, c, options, 1);
  std::vector<bool> split;
  for (const VisionItem& it : p.rows[0].items) split.push_back(it.split());
  EXPECT_EQ(split, (std::vector<bool>{true, false, true}));  // 15 rows, 2 rows (kept), 8 rows
  EXPECT_EQ(p.rows[0].items[0].shard_rows, (std::vector<int64_t>{0, 5, 10, 15}));
  EXPECT_EQ(p.rows[0].items[2].shard_rows, (std::vector<int64_t>{0, 3, 6, 8}));
  expect_routes_cover(batch, p);
  ASSERT_EQ(p.rows[0].vision_kept_whole.size(), 1u);
  EXPECT_EQ(p.rows[0].vision_kept_whole[0],
            "image 1 (8 patches) stays whole: it has 2 merge windows (embedding "
            "rows), fewer than the context group's 3 ranks");
  c.vision_heads = 16;
  const StepPlan none = make_step_plan(batch, c, options, 0);
  for (const VisionItem& it : none.rows[0].items) EXPECT_FALSE(it.split());
  ASSERT_EQ(none.rows[0].vision_kept_whole.size(), 3u);
  EXPECT_EQ(
      none.rows[0].vision_kept_whole[0],
      "image 0 (60 patches) stays whole: its tower's 16 attention heads do not divide by the context group's 3 ranks");
}

}  // namespace
}  // namespace mmsp::plan
