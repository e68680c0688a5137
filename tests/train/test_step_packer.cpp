// Step packing (global budget, row limits from the planner's own assignment, epoch order)
// and step pixels (the whole batch's layout, only the needed items decoded).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "data_test_util.h"
#include "mmsp/plan/packing.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/data/shapes_dataset.h"
#include "mmsp/train/data/splitmix64.h"
#include "mmsp/train/data/step_packer.h"
#include "mmsp/train/data/step_pixels.h"
#include "mmsp/train/step_fingerprint.h"

namespace mmsp::train {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
using testing::tiny_config;

// Text-only samples of given lengths.
class LengthsDataset : public Dataset {
 public:
  explicit LengthsDataset(std::vector<int64_t> lengths) : lengths_(std::move(lengths)) {}
  int64_t size() const override { return static_cast<int64_t>(lengths_.size()); }
  plan::Sequence sequence(int64_t index) const override {
    plan::Sequence s;
    s.input_ids.assign(lengths_.at(index), 7);
    return s;
  }
  at::Tensor image_pixels(int64_t, int64_t) const override { return {}; }
  at::Tensor video_pixels(int64_t, int64_t) const override { return {}; }
  std::string describe() const override { return "lengths"; }

 private:
  std::vector<int64_t> lengths_;
};

std::vector<int64_t> random_lengths(int64_t n, int64_t lo, int64_t hi, uint64_t seed) {
  SplitMix64 rng(seed, 0);
  std::vector<int64_t> out(n);
  for (auto& l : out) l = rng.between(lo, hi);
  return out;
}

PackerOptions packer(int64_t tokens_per_row, int rows, bool shuffle = true) {
  PackerOptions o;
  o.tokens_per_row = tokens_per_row, o.rows = rows, o.seed = 11, o.shuffle = shuffle;
  return o;
}

TEST(StepPacker, BudgetAndRowsRespected) {
  const LengthsDataset data(random_lengths(200, 5, 60, 1));
  for (int rows : {1, 2, 3}) {
    const StepPacker p(data, packer(100, rows));
    DataPosition pos;
    for (int step = 0; step < 60; ++step) {
      const auto samples = p.next_step(pos);
      std::vector<int64_t> lengths;
      for (int64_t s : samples) lengths.push_back(data.sequence(s).input_ids.size());
      const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
      EXPECT_LE(total, 100 * rows);
      EXPECT_GE(static_cast<int>(samples.size()), rows);
      for (const auto& row : plan::assign_sequences_to_dp(lengths, rows)) {
        int64_t sum = 0;
        for (int64_t k : row) sum += lengths[k];
        EXPECT_LE(sum, 100) << "rows " << rows << " step " << step;
      }
    }
  }
}

// The same step budget gives the same steps however it is split into rows.
TEST(StepPacker, SameStepsForEveryMeshOfOneBudget) {
  const LengthsDataset equal(std::vector<int64_t>(50, 10));  // 8 per step, 4 per row: no give-back
  const StepPacker a(equal, packer(80, 1)), b(equal, packer(40, 2)), c(equal, packer(20, 4));
  DataPosition pa, pb, pc;
  for (int step = 0; step < 20; ++step) {
    const auto sa = a.next_step(pa);
    EXPECT_EQ(sa.size(), 8u);
    EXPECT_EQ(sa, b.next_step(pb)) << step;
    EXPECT_EQ(sa, c.next_step(pc)) << step;
  }
  EXPECT_EQ(pa.epoch, 3);
  EXPECT_EQ(pa.offset, 10);
  // with mixed lengths, 2 rows only ever give back: their step is a prefix of 1 row's
  const LengthsDataset mixed(random_lengths(300, 1, 40, 2));
  const StepPacker one(mixed, packer(160, 1)), two(mixed, packer(80, 2));
  DataPosition pos;
  int same = 0;
  for (int step = 0; step < 100; ++step) {
    DataPosition p1 = pos, p2 = pos;
    const auto s1 = one.next_step(p1), s2 = two.next_step(p2);
    ASSERT_LE(s2.size(), s1.size());
    EXPECT_TRUE(std::equal(s2.begin(), s2.end(), s1.begin())) << step;
    same += s1 == s2;
    pos = p2;
  }
  EXPECT_GT(same, 50);
}

TEST(StepPacker, EpochsWrapInOrder) {
  const LengthsDataset data(random_lengths(37, 1, 30, 3));
  const StepPacker p(data, packer(40, 2));
  std::vector<int64_t> stream;
  DataPosition pos;
  while (pos.epoch < 3) {
    const auto s = p.next_step(pos);
    stream.insert(stream.end(), s.begin(), s.end());
  }
  // the steps read epoch 0's order, then epoch 1's, then epoch 2's
  std::vector<int64_t> want;
  for (int64_t e = 0; e < 3; ++e) {
    const auto order = p.epoch_order(e);
    EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 37u) << "a permutation";
    want.insert(want.end(), order.begin(), order.end());
  }
  want.insert(want.end(), stream.begin() + want.size(), stream.end());  // into epoch 3
  EXPECT_EQ(stream, want);
  EXPECT_LT(pos.offset, 37);
  EXPECT_NE(p.epoch_order(0), p.epoch_order(1));
  EXPECT_EQ(p.epoch_order(1), StepPacker(data, packer(40, 2)).epoch_order(1)) << "deterministic";
  PackerOptions other = packer(40, 2);
  other.seed = 12;
  EXPECT_NE(p.epoch_order(0), StepPacker(data, other).epoch_order(0));
  const auto plain = StepPacker(data, packer(40, 2, false)).epoch_order(5);
  for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(plain[i], i);
}

TEST(StepPacker, Errors) {
  const LengthsDataset data({10, 20, 30, 50, 10});
  const StepPacker p(data, packer(40, 1, false));
  DataPosition pos;
  EXPECT_EQ(p.next_step(pos), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.next_step(pos), (std::vector<int64_t>{2}));
  EXPECT_THAT(error_of([&] { p.next_step(pos); }),
              HasSubstr("sample 3 has 50 tokens, more than one row holds (tokens_per_row 40)"));
  EXPECT_THAT(error_of([&] { StepPacker q(data, packer(20, 6)); }),
              HasSubstr("dataset has 5 samples, fewer than rows (6)"));
  EXPECT_THAT(error_of([&] { StepPacker q(data, packer(0, 1)); }), HasSubstr("tokens_per_row is 0"));
  DataPosition bad{0, 5};
  EXPECT_THAT(error_of([&] { p.next_step(bad); }), HasSubstr("data position (epoch 0, offset 5) is outside"));
}

// ---- step pixels ----

// Records which items were decoded.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(const Dataset& inner) : inner_(inner) {}
  int64_t size() const override { return inner_.size(); }
  plan::Sequence sequence(int64_t i) const override { return inner_.sequence(i); }
  at::Tensor image_pixels(int64_t i, int64_t k) const override {
    decoded.insert({i, k, 0});
    return inner_.image_pixels(i, k);
  }
  at::Tensor video_pixels(int64_t i, int64_t k) const override {
    decoded.insert({i, k, 1});
    return inner_.video_pixels(i, k);
  }
  std::string describe() const override { return inner_.describe(); }
  mutable std::set<std::array<int64_t, 3>> decoded;

 private:
  const Dataset& inner_;
};

TEST(StepPixels, HoldsOnlyNeededItems) {
  for (const std::string name : {"tiny-qwen2-vl", "tiny-qwen3-vl"}) {
    SCOPED_TRACE(name);
    const auto config = tiny_config(name);
    ShapesOptions o;
    o.samples = 64;
    o.seed = 5;
    const ShapesDataset shapes(o, config);
    const CountingDataset data(shapes);
    std::vector<int64_t> samples = {3, 17, 0, 42, 9, 11};
    for (int64_t i = 0, videos = 0; i < shapes.size() && videos < 2; ++i)  // and two videos
      if (!shapes.sequence(i).video_grid_thw.empty() && ++videos) samples.push_back(i);
    const plan::Batch batch = make_batch(data, samples);
    // odd images and even videos of the batch
    auto wanted = [](plan::VisionKind kind, int64_t item) {
      return kind == plan::VisionKind::image ? item % 2 == 1 : item % 2 == 0;
    };
    auto needed = [&](plan::VisionKind kind, int64_t item) { return HeldPart{wanted(kind, item), true, 0, 0}; };
    const model::PixelInputs px = load_pixels(data, samples, batch, config, needed, at::kDouble);
    EXPECT_EQ(px.images.scalar_type(), at::kDouble);
    // the planner's items (of either dp row) name each item by its batch index
    plan::PlanOptions po;
    po.mesh.dp = 2;
    const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, po, 0);
    std::vector<plan::VisionItem> all_items = plan.rows[0].items;
    all_items.insert(all_items.end(), plan.rows[1].items.begin(), plan.rows[1].items.end());
    int64_t images = 0, videos = 0, expected_decodes = 0, image_rows = 0, video_rows = 0;
    for (const plan::VisionItem& item : all_items) {
      const bool image = item.kind == plan::VisionKind::image;
      (image ? images : videos) += 1;
      const int64_t sample = samples[item.sequence];
      const int64_t offset = (image ? px.image_offsets : px.video_offsets).at(item.batch_index);
      if (wanted(item.kind, item.batch_index)) {
        ++expected_decodes;
        (image ? image_rows : video_rows) += item.patches;
        ASSERT_EQ(offset, px.first_row(item, -1));
        const at::Tensor got = (image ? px.images : px.videos).narrow(0, offset, item.patches);
        const at::Tensor want =
            image ? shapes.image_pixels(sample, item.index) : shapes.video_pixels(sample, item.index);
        EXPECT_TRUE(at::equal(got, want.to(at::kDouble))) << item.batch_index;
        EXPECT_EQ(data.decoded.count({sample, item.index, image ? 0 : 1}), 1u);
      } else {
        EXPECT_EQ(offset, -1) << "not encoded here: not held";
        EXPECT_THAT(error_of([&] { px.first_row(item, -1); }), HasSubstr("not held on this rank"));
      }
    }
    EXPECT_GT(images, 4);
    EXPECT_GT(videos, 0);
    EXPECT_EQ(static_cast<int64_t>(px.image_offsets.size()), images);
    EXPECT_EQ(static_cast<int64_t>(px.video_offsets.size()), videos);
    EXPECT_EQ(px.images.size(0), image_rows) << "room for the needed items only";
    EXPECT_EQ(px.videos.size(0), video_rows);
    EXPECT_EQ(static_cast<int64_t>(data.decoded.size()), expected_decodes) << "nothing else decoded";
  }
}

// Vision-tower SP: a rank holds only the pixel rows of its shard of a split item (and
// decodes the item once); reading rows outside the shard is an error naming them.
TEST(StepPixels, HoldsOnlyItsShardOfASplitItem) {
  const auto config = tiny_config("tiny-qwen2-vl");
  ShapesOptions o;
  o.samples = 16;
  o.seed = 5;
  const ShapesDataset shapes(o, config);
  const CountingDataset data(shapes);
  const std::vector<int64_t> samples = {0, 1, 2, 3};
  const plan::Batch batch = make_batch(data, samples);
  auto needed = [](plan::VisionKind kind, int64_t item) {
    // embedding rows 1..3 of image 0: its patch rows 4..12 (2 × 2 patches a row)
    return kind == plan::VisionKind::image && item == 0 ? HeldPart{true, false, 1, 2} : HeldPart{};
  };
  const model::PixelInputs px = load_pixels(data, samples, batch, config, needed, at::kFloat);
  ASSERT_EQ(px.images.size(0), 8) << "room for the shard only";
  const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, {}, 0);
  const plan::VisionItem* first = nullptr;
  for (const plan::VisionItem& item : plan.rows[0].items)
    if (item.kind == plan::VisionKind::image && item.batch_index == 0) first = &item;
  ASSERT_NE(first, nullptr);
  ASSERT_GE(first->patches, 12);
  EXPECT_EQ(px.row_of(*first, -1, 4, 8), 0);
  EXPECT_EQ(px.row_of(*first, -1, 6, 2), 2);
  const at::Tensor want = shapes.image_pixels(samples[first->sequence], first->index).narrow(0, 4, 8);
  EXPECT_TRUE(at::equal(px.images, want));
  EXPECT_THAT(error_of([&] { px.row_of(*first, -1, 0, 4); }),
              HasSubstr("rows 0..4 of image 0 are not held on this rank (it holds rows 4..12)"));
  EXPECT_EQ(data.decoded.size(), 1u);
}

TEST(StepPixels, Llava) {
  const auto config = tiny_config("tiny-llava");
  ShapesOptions o;
  o.samples = 16;
  const ShapesDataset data(o, config);
  const std::vector<int64_t> samples = {0, 1, 2, 3, 4, 5};
  const plan::Batch batch = make_batch(data, samples);
  int64_t n = 0;
  for (const auto& s : batch.sequences) n += static_cast<int64_t>(s.image_grid_thw.size());
  const model::PixelInputs px = load_pixels(
      data, samples, batch, config,
      [](plan::VisionKind, int64_t item) {
        return HeldPart{item == 1, true, 0, 0};
      },
      at::kFloat);
  ASSERT_EQ(px.images.sizes(), (std::vector<int64_t>{1, 3, 56, 56})) << "the needed image only";
  EXPECT_FALSE(px.videos.defined());
  std::vector<int64_t> offsets(n, -1);
  offsets[1] = 0;
  EXPECT_EQ(px.image_offsets, offsets);
  // item 1 is the second image of the batch, in batch order
  int64_t sample = 0, index = 1;
  if (batch.sequences[0].image_grid_thw.size() == 1) sample = 1, index = 0;
  EXPECT_TRUE(at::equal(px.images[0], data.image_pixels(samples[sample], index)));
}

// ---- step fingerprints: the odd rank and the first differing field -------------------

TEST(StepFingerprint, NamesTheOddRankAndTheFirstField) {
  const StepFingerprint a = {{"samples", 1}, {"sequence sizes", 2}, {"collectives", 3}};
  StepFingerprint b = a, c = a;
  b[0].hash = 9;  // another sample
  c[2].hash = 7;  // same batch, another plan
  EXPECT_EQ(decode_fingerprint(encode_fingerprint(a)), a);
  EXPECT_TRUE(decode_fingerprint("samples=12;").empty());  // malformed
  EXPECT_NO_THROW(check_same_step(3, {a, a, a, a}));
  EXPECT_THAT(testing::error_of([&] {
                check_same_step(3, {a, a, b, a});
              }),
              ::testing::HasSubstr("step 3: rank 2 is about to run another step than ranks 0, 1, 3 "
                                   "(first difference: samples)"));
  EXPECT_THAT(testing::error_of([&] {
                check_same_step(5, {c, a, a});
              }),
              ::testing::HasSubstr("step 5: rank 0 is about to run another step than ranks 1, 2 "
                                   "(first difference: collectives)"));
  // two ranks that disagree: the tie goes to rank 0's fingerprint
  EXPECT_THAT(testing::error_of([&] {
                check_same_step(1, {a, b});
              }),
              ::testing::HasSubstr("rank 1 is about to run another step than rank 0 (first difference: samples)"));
}

TEST(StepFingerprint, DependsOnTheBatchAndThePlan) {
  ShapesOptions o;
  o.samples = 40;
  const model::ModelConfig config = testing::tiny_config("tiny-qwen2-vl");
  ShapesDataset data(o, config);
  plan::PlanOptions options;
  options.mesh = {1, 2, 2};
  auto fingerprint = [&](const std::vector<int64_t>& samples, plan::Layout layout) {
    options.layout = layout;
    const plan::Batch batch = make_batch(data, samples);
    return step_fingerprint(samples, batch, plan::make_step_plan(batch, config.conventions, options, 0));
  };
  const StepFingerprint base = fingerprint({0, 1, 2}, plan::Layout::zigzag);
  ASSERT_EQ(base.size(), 7u);
  EXPECT_EQ(fingerprint({0, 1, 2}, plan::Layout::zigzag), base);  // deterministic
  // the same step planned for another rank: the same fingerprint (only shared facts)
  const plan::Batch batch = make_batch(data, {0, 1, 2});
  EXPECT_EQ(step_fingerprint({0, 1, 2}, batch, plan::make_step_plan(batch, config.conventions, options, 3)), base);
  const StepFingerprint fewer = fingerprint({0, 1}, plan::Layout::zigzag);
  EXPECT_NE(fewer[0].hash, base[0].hash);  // samples
  EXPECT_NE(fewer[1].hash, base[1].hash);  // sequence sizes
}

}  // namespace
}  // namespace mmsp::train
