// The whole step plan on random batches over meshes up to 8 wide: tokens held once,
// positions and labels equal to the unsharded references, every routed row on the slot
// of its placeholder; plus golden packing, errors, and the JSON forms.
#include "mmsp/plan/step_plan.h"

#include <map>

#include "mmsp/plan/plan_json.h"
#include "plan_test_util.h"

namespace mmsp::plan {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
using testing::SeqBuilder;
using V = std::vector<int64_t>;

Batch random_batch(std::mt19937& rng, const ModelConventions& c, int sequences) {
  Batch batch;
  for (int s = 0; s < sequences; ++s) {
    SeqBuilder b(c, static_cast<uint32_t>(rng()));
    const bool secs = c.scales_video_time() && rng() % 2;
    b.text(1 + rng() % 12);
    const int items = rng() % 4;
    for (int k = 0; k < items; ++k) {
      const int64_t m = c.spatial_merge_size;
      Grid g{1 + static_cast<int64_t>(rng() % 3), m * (1 + static_cast<int64_t>(rng() % 4)),
             m * (1 + static_cast<int64_t>(rng() % 4))};
      if (c.supports_video() && rng() % 3 == 0)
        b.video(g, secs ? 0.5 * (rng() % 4) : -1);
      else
        b.image(g);
      b.text(rng() % 6);
    }
    if (rng() % 3 == 0) b.mask_first(rng() % 8);
    Sequence seq = b.build();
    if (!secs) seq.second_per_grid_ts.clear();
    batch.sequences.push_back(seq);
  }
  return batch;
}

// (item, row) of every placeholder token of a sequence, by scanning it plainly.
std::vector<std::pair<int64_t, int64_t>> placeholder_rows(const Sequence& s, const ModelConventions& c) {
  std::vector<std::pair<int64_t, int64_t>> out(s.input_ids.size(), {-1, -1});
  // item order = first appearance; rows count per item in token order
  std::map<std::pair<int, int64_t>, int64_t> rows;  // (kind, index) -> rows seen
  int64_t image = -1, video = -1, frames_left = 0, tokens_left = 0;
  const int64_t m = c.spatial_merge_size;
  for (size_t i = 0; i < s.input_ids.size(); ++i) {
    const int64_t t = s.input_ids[i];
    if (t == c.image_token_id) {
      if (tokens_left == 0) tokens_left = vision_row_count(s.image_grid_thw[++image], m);
      out[i] = {image, rows[{0, image}]++};
      --tokens_left;
    } else if (c.video_token_id >= 0 && t == c.video_token_id) {
      if (frames_left == 0) frames_left = vision_row_count(s.video_grid_thw[++video], m);
      out[i] = {video, rows[{1, video}]++};
      --frames_left;
    }
  }
  return out;
}

TEST(StepPlanProperty, RandomBatchesEveryRank) {
  std::mt19937 rng(23);
  const std::string families[] = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "internvl"};
  int layouts = 0, whole = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const ModelConventions c = testing::released(families[trial % 5]);
    PlanOptions o;
    o.mesh.ring = std::uniform_int_distribution<int>(1, 4)(rng);
    o.mesh.ulysses = std::uniform_int_distribution<int>(1, 8 / o.mesh.ring)(rng);
    o.mesh.dp = std::uniform_int_distribution<int>(1, 2)(rng);
    o.layout = trial % 4 == 3 ? Layout::contiguous : Layout::zigzag;
    // adaptive on every other zigzag trial; loose targets on some, so that small random rows
    // keep segments whole too (with the default targets most of them fall back to zigzag)
    if (o.layout == Layout::zigzag && trial % 2 == 1) {
      o.placement = Placement::adaptive;
      if (trial % 4 == 1) o.placement_balance = {1.0, 4.0};
    }
    const Batch batch = random_batch(rng, c, o.mesh.dp + static_cast<int>(rng() % 4));
    const StepPlan plan = make_step_plan(batch, c, o, 0);
    const int S = o.mesh.context();

    // references per sequence
    std::vector<testing::RefPositions> ref_pos;
    std::vector<V> ref_labels;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> ref_rows;
    int64_t ref_count = 0;
    for (const Sequence& s : batch.sequences) {
      ref_pos.push_back(testing::reference_positions(s, c));
      ref_labels.push_back(testing::reference_labels(s, c));
      ref_rows.push_back(placeholder_rows(s, c));
      for (int64_t l : ref_labels.back()) ref_count += l != -100;
    }
    ASSERT_EQ(plan.label_count, ref_count);
    for (size_t s = 0; s < batch.sequences.size(); ++s) ASSERT_EQ(plan.rope_deltas[s], ref_pos[s].delta);

    std::vector<int> seen_seq(batch.sequences.size(), 0);
    for (int d = 0; d < o.mesh.dp; ++d) {
      const RowPlan& row = plan.rows[d];
      for (const Segment& seg : row.packing.segments) ++seen_seq[seg.sequence];
      std::vector<RankPlan> ranks;
      for (int c2 = 0; c2 < S; ++c2)
        ranks.push_back(
            make_rank_plan(batch, plan, global_rank(o.mesh, {d, c2 / o.mesh.ulysses, c2 % o.mesh.ulysses})));
      V held(row.packing.length, 0);
      for (int cr = 0; cr < S; ++cr) {
        const RankPlan& rp = ranks[cr];
        ASSERT_EQ(rp.coords.context_rank(o.mesh), cr);
        for (int64_t slot = 0; slot < rp.local_length; ++slot) {
          const int64_t p = rp.tokens[slot];
          if (p < 0) {
            ASSERT_EQ(rp.labels[slot], -100);
            continue;
          }
          ++held[p];
          const SlotLocation loc = row.shards.locate(p);
          ASSERT_EQ(loc.context_rank, cr);
          ASSERT_EQ(loc.slot, slot);
          const Segment& seg = row.packing.segments[rp.segment_ids[slot]];
          const int64_t i = p - seg.start;
          ASSERT_EQ(rp.segment_index[slot], i);
          for (int r = 0; r < rp.position_rows; ++r)
            ASSERT_EQ(rp.positions[r * rp.local_length + slot], ref_pos[seg.sequence].rows[r][i])
                << "trial " << trial << " seq " << seg.sequence << " token " << i << " row " << r;
          ASSERT_EQ(rp.labels[slot], ref_labels[seg.sequence][i]);
        }
        // routes: what src sends to me is exactly what I expect from src, slot by slot
        for (int src = 0; src < S; ++src) {
          const auto& sent = ranks[src].routes.send[cr];
          const auto& got = rp.routes.recv[src];
          ASSERT_EQ(sent.size(), got.size());
          for (size_t k = 0; k < sent.size(); ++k) {
            ASSERT_EQ(sent[k].slot, got[k].slot);
            ASSERT_EQ(sent[k].item, got[k].item);
            ASSERT_EQ(sent[k].row, got[k].row);
            ASSERT_EQ(sent[k].src_row, got[k].src_row);
            ASSERT_LT(sent[k].src_row, ranks[src].routes.encoder_rows);
            ASSERT_EQ(row.items[got[k].item].encoder_rank, src);
            // the row lands on the slot of its placeholder
            const int64_t p = rp.tokens[got[k].slot];
            ASSERT_GE(p, 0);
            const Segment& seg = row.packing.segments[rp.segment_ids[got[k].slot]];
            const auto expect = ref_rows[seg.sequence][p - seg.start];
            const VisionItem& item = row.items[got[k].item];
            ASSERT_EQ(item.sequence, seg.sequence);
            ASSERT_EQ(item.index, expect.first);
            ASSERT_EQ(got[k].row, expect.second);
          }
        }
        // every placeholder slot of mine is a visual slot, and receives exactly one row
        V visual;
        for (int64_t slot = 0; slot < rp.local_length; ++slot) {
          const int64_t p = rp.tokens[slot];
          if (p < 0) continue;
          const Segment& seg = row.packing.segments[rp.segment_ids[slot]];
          if (ref_rows[seg.sequence][p - seg.start].first >= 0) visual.push_back(slot);
        }
        ASSERT_EQ(rp.routes.visual_slots, visual);
        size_t received = 0;
        for (const auto& r : rp.routes.recv) received += r.size();
        ASSERT_EQ(received, visual.size());
      }
      for (const Segment& seg : row.packing.segments) {
        for (int64_t i = 0; i < seg.padded_length; ++i) ASSERT_EQ(held[seg.start + i], i < seg.length ? 1 : 0);
        if (seg.home < 0) continue;
        ++whole;
        // a whole segment: unpadded, every token on its home rank in consecutive slots
        ASSERT_EQ(seg.padded_length, seg.length);
        const SlotLocation first = row.shards.locate(seg.start);
        ASSERT_EQ(first.context_rank, seg.home);
        ASSERT_GE(first.contiguous, seg.length);
      }
      // Vision DP: each item on one rank; encoder rows partition each rank's output
      V rows_of(S, 0);
      for (const VisionItem& it : row.items) {
        ASSERT_TRUE(it.encoder_rank >= 0 && it.encoder_rank < S);
        ASSERT_EQ(it.encoder_row, rows_of[it.encoder_rank]);
        rows_of[it.encoder_rank] += it.rows;
      }
      for (int cr = 0; cr < S; ++cr) ASSERT_EQ(ranks[cr].routes.encoder_rows, rows_of[cr]);
      ASSERT_LE(row.load.vision_ratio, row.load.greedy_vision_ratio + 1e-9);
    }
    for (int n : seen_seq) ASSERT_EQ(n, 1);
    ++layouts;
  }
  EXPECT_EQ(layouts, 3000);
  EXPECT_GT(whole, 1000);  // adaptive trials did keep segments whole
}

TEST(StepPlanGolden, PositionsRestartPerSegment) {
  const ModelConventions c = testing::released("qwen2_vl");
  Batch batch;
  batch.sequences.push_back(SeqBuilder(c).text(2).image({1, 4, 4}).text(1).build());  // 9 tokens
  batch.sequences.push_back(SeqBuilder(c).text(3).build());
  PlanOptions o;
  o.mesh = {1, 2, 1};
  const StepPlan plan = make_step_plan(batch, c, o, 0);
  const RowPlan& row = plan.rows[0];
  EXPECT_EQ(row.packing.cu_seqlens, (V{0, 12, 16}));
  const V pos = row_position_ids(plan, 0);
  const V t(pos.begin(), pos.begin() + 16), h(pos.begin() + 16, pos.begin() + 32);
  EXPECT_EQ(t, (V{0, 1, 2, 3, 3, 3, 3, 5, 6, 1, 1, 1, 0, 1, 2, 1}));
  EXPECT_EQ(h, (V{0, 1, 2, 3, 3, 4, 4, 5, 6, 1, 1, 1, 0, 1, 2, 1}));
  EXPECT_EQ(plan.rope_deltas, (V{7 - 9, 0}));
  // ring rank 0 holds chunks 0 and 3 of each segment: [0..2] [9..11] of seg 0, [12] [15] of seg 1
  EXPECT_EQ(plan.mine.tokens, (V{0, 1, 2, -1, -1, -1, 12, -1}));
  EXPECT_EQ(plan.mine.labels, (V{batch.sequences[0].input_ids[1], 151652, -100, -100, -100, -100,
                                 batch.sequences[1].input_ids[1], -100}));
}

TEST(StepPlanGolden, LoadReportCountsCausalPairsPerRank) {
  // One 16-token text sequence on ring 2 x ulysses 2: chunks of 4.
  const ModelConventions c = testing::released("llava");
  Batch batch;
  batch.sequences.push_back(SeqBuilder(c).text(16).build());
  PlanOptions o;
  o.mesh = {1, 2, 2};
  const StepPlan zig = make_step_plan(batch, c, o, 0);
  // ring 0: chunks 0 and 3 -> (1+..+4) + (13+..+16) = 68 pairs, shared by 2 ulysses ranks;
  // ring 1: chunks 1 and 2 -> (5+..+8) + (9+..+12) = 68.
  EXPECT_EQ(zig.rows[0].load.pairs, (std::vector<double>{34, 34, 34, 34}));
  EXPECT_EQ(zig.rows[0].load.tokens, (V{4, 4, 4, 4}));
  EXPECT_DOUBLE_EQ(zig.rows[0].load.pairs_ratio, 1.0);
  o.layout = Layout::contiguous;
  const StepPlan flat = make_step_plan(batch, c, o, 0);
  // ring 0 holds tokens 0..7 (36 pairs), ring 1 tokens 8..15 (100 pairs)
  EXPECT_EQ(flat.rows[0].load.pairs, (std::vector<double>{18, 18, 50, 50}));
  EXPECT_DOUBLE_EQ(flat.rows[0].load.pairs_ratio, 50.0 / 34.0);
}

TEST(StepPlanGolden, VisionCostAndRoutesOfOneImage) {
  // An image whose 4 rows straddle two ranks: encoded by the rank holding most of them.
  const ModelConventions c = testing::released("qwen2_vl");
  Batch batch;
  batch.sequences.push_back(SeqBuilder(c).text(3).image({1, 4, 4}).text(7).build());  // 16 tokens
  PlanOptions o;
  o.mesh = {1, 1, 2};  // ulysses 2: slots 0..7 on rank 0, 8..15 on rank 1
  const StepPlan plan = make_step_plan(batch, c, o, 0);
  const RowPlan& row = plan.rows[0];
  ASSERT_EQ(row.items.size(), 1u);
  EXPECT_EQ(row.items[0].pieces[0].packed, 4);  // pads at 4..7: all on rank 0
  EXPECT_EQ(row.items[0].preferred_rank, 0);
  EXPECT_EQ(row.items[0].encoder_rank, 0);
  EXPECT_DOUBLE_EQ(row.load.vision_cost[0], encoder_cost({1, 4, 4}, o.vision_cost));
  EXPECT_DOUBLE_EQ(row.load.vision_cost[1], 0.0);
  EXPECT_EQ(plan.mine.routes.visual_slots, (V{4, 5, 6, 7}));
  ASSERT_EQ(plan.mine.routes.send[0].size(), 4u);  // to itself, rows 0..3 onto slots 4..7
  EXPECT_EQ(plan.mine.routes.send[0][3].slot, 7);
  EXPECT_EQ(plan.mine.routes.send[0][3].row, 3);
  EXPECT_TRUE(plan.mine.routes.send[1].empty());

  // Moved later, its rows sit on rank 1: rank 1 encodes it, nothing travels.
  Batch later;
  later.sequences.push_back(SeqBuilder(c).text(10).image({1, 4, 4}).text(1).build());  // 17 -> 18
  const StepPlan p2 = make_step_plan(later, c, o, 1);
  EXPECT_EQ(p2.rows[0].items[0].pieces[0].packed, 11);  // slots 2..5 of rank 1 (L = 9)
  EXPECT_EQ(p2.rows[0].items[0].preferred_rank, 1);
  EXPECT_EQ(p2.rows[0].items[0].encoder_rank, 1);
  EXPECT_EQ(p2.mine.routes.visual_slots, (V{2, 3, 4, 5}));
  EXPECT_EQ(p2.mine.routes.recv[1].size(), 4u);
  EXPECT_TRUE(p2.mine.routes.recv[0].empty());
}

TEST(StepPlanErrors, BadInputsNameTheValue) {
  const ModelConventions c = testing::released("qwen2_vl");
  PlanOptions o;
  o.mesh = {1, 2, 2};
  EXPECT_THAT(error_of([&] { make_step_plan(Batch{}, c, o, 0); }), HasSubstr("batch is empty"));
  Batch batch;
  batch.sequences.push_back(SeqBuilder(c).text(2).image({1, 4, 4}).build());
  batch.sequences.push_back(SeqBuilder(c).text(2).image({1, 4, 4}).build());
  batch.sequences[1].image_grid_thw[0] = {1, 4, 6};
  EXPECT_THAT(error_of([&] { make_step_plan(batch, c, o, 0); }),
              HasSubstr("sequence 1: image 0 has 4 placeholder tokens but grid [1, 4, 6] with "
                        "spatial_merge_size 2 needs 6"));
  batch.sequences[1].image_grid_thw[0] = {1, 4, 4};
  EXPECT_THAT(error_of([&] { make_step_plan(batch, c, o, 4); }), HasSubstr("rank 4 is outside the world of 4"));
  o.mesh = {3, 1, 1};
  EXPECT_THAT(error_of([&] { make_step_plan(batch, c, o, 0); }), HasSubstr("batch has 2 sequences but dp is 3"));
}

TEST(PlanJson, BatchRoundTripAndPlanFields) {
  const nlohmann::json j = nlohmann::json::parse(R"({"sequences": [
    {"input_ids": [5, 6, 151652, 151655, 151655, 151655, 151655, 151653, 7],
     "image_grid_thw": [[1, 4, 4]], "loss_mask": [0, 0, 1, 1, 1, 1, 1, 1, 1]},
    {"input_ids": [8, 9, 10]}]})");
  const Batch batch = batch_from_json(j);
  ASSERT_EQ(batch.sequences.size(), 2u);
  EXPECT_EQ(batch.sequences[0].image_grid_thw[0], (Grid{1, 4, 4}));
  const ModelConventions c = testing::released("qwen2_vl");
  PlanOptions o;
  o.mesh = {1, 2, 1};
  const StepPlan plan = make_step_plan(batch, c, o, 1);
  const nlohmann::json out = step_plan_to_json(batch, plan, {0, 1});
  for (const char* key :
       {"segments", "cu_seqlens", "position_ids", "rope_deltas", "ranks", "balance", "vision_items", "label_count"})
    EXPECT_TRUE(out.contains(key)) << key;
  EXPECT_EQ(out["ranks"].size(), 2u);
  EXPECT_EQ(out["ranks"][1]["rank"], 1);
  EXPECT_EQ(out["position_ids"][0].size(), 3u);
  EXPECT_EQ(out["segments"][0]["padded_length"], 12);
  EXPECT_EQ(out["label_count"], 3 + 2);  // <vs>, <ve>, 7 of seq 0 (6 is masked); 9, 10 of seq 1
  const std::string text = step_plan_summary(plan);
  EXPECT_THAT(text, HasSubstr("max/mean"));
  EXPECT_THAT(error_of([] { batch_from_json(nlohmann::json::parse(R"({"sequences": [{"input_ids": [1, "a"]}]})")); }),
              HasSubstr("sequence 0: input_ids[1] must be an integer"));
  EXPECT_THAT(error_of([] { batch_from_json(nlohmann::json::parse(R"({"sequences": []})")); }),
              HasSubstr("batch is empty"));
  EXPECT_THAT(
      error_of([] {
        batch_from_json(nlohmann::json::parse(R"({"sequences": [{"input_ids": [1], "image_grid_thw": [[1, 2]]}]})"));
      }),
      HasSubstr("sequence 0: image_grid_thw[0] must be [t, h, w]"));
}

}  // namespace
}  // namespace mmsp::plan
