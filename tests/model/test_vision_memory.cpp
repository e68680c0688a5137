// The preflight's vision term (model/vision/vision_memory.h, train/memory/memory_estimate.h)
// against the memory counter: each family's tiny tower encodes a few items (images and
// videos of the shapes data) and the bytes it keeps for the backward, and the peak of its
// backward, are measured; the estimate must be within 0.9–1.2 of them, and the blocks'
// part must shrink to one block's input per token when the blocks are recomputed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdio>

#include "mmsp/model/family.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/vision/vision_memory.h"
#include "mmsp/model/vlm.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/data/shapes_dataset.h"
#include "mmsp/train/data/step_packer.h"
#include "mmsp/train/data/step_pixels.h"
#include "mmsp/train/memory/memory_counter.h"
#include "mmsp/train/memory/vision_load.h"

using namespace mmsp;

namespace {

struct TowerFigures {
  int64_t tokens = 0, kept = 0, peak = 0;  // measured: tokens encoded, kept after the forward, backward's peak
  train::VisionLoad load;
};

// Encodes the items of the shapes samples `samples` on one process, its blocks recomputed
// or not, and measures what the tower keeps and its backward's peak.
TowerFigures measure_tower(const std::string& config_path, model::ActivationCheckpointing mode, int samples) {
  const model::ModelConfig config = model::load_model_config(config_path);
  at::manual_seed(3);
  const std::shared_ptr<model::Vlm> vlm = model::build_vlm(config);
  vlm->set_activation_checkpointing(mode, false);
  train::ShapesOptions shapes;
  shapes.seed = 5;
  shapes.min_tokens_per_side = 6, shapes.max_tokens_per_side = 10;  // enough tokens that the blocks dominate
  const train::ShapesDataset data(shapes, config);
  std::vector<int64_t> ids;
  for (int i = 0; i < samples; ++i) ids.push_back(i);
  const plan::Batch batch = train::make_batch(data, ids);
  plan::PlanOptions po;
  po.mesh = {1, 1, 1};
  const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, po, 0);
  const std::vector<plan::VisionItem>& items = plan.rows.at(0).items;
  TowerFigures f;
  f.load = train::vision_loads(plan, model::VisionMode::routed).at(0);
  for (const plan::VisionItem& item : items) f.tokens += item.patches;
  train::MemoryCounter memory;
  {
    // From before the pixels are read, as a step holds them (the estimate counts them).
    const int64_t base = memory.current_bytes();
    memory.reset_peak();
    const model::PixelInputs pixels = train::load_pixels(
        data, ids, batch, config, train::pixels_encoded_here(plan, model::VisionMode::routed), at::kFloat);
    const model::TowerInput input = vlm->tower().gather(items, pixels);
    at::Tensor rows = vlm->tower().encode(input);
    f.kept = memory.current_bytes() - base;
    rows.sum().backward();
    f.peak = memory.peak_bytes() - base;
  }
  return f;
}

class VisionMemory : public ::testing::TestWithParam<std::string> {};

TEST_P(VisionMemory, EstimateIsWithinTheMeasuredBytesOfEachFamilysTower) {
  const std::string path = std::string(MMSP_SOURCE_DIR) + "/configs/" + GetParam() + ".json";
  const model::ModelConfig config = model::load_model_config(path);
  for (auto mode : {model::ActivationCheckpointing::none, model::ActivationCheckpointing::all}) {
    const TowerFigures f = measure_tower(path, mode, 6);
    ASSERT_GT(f.tokens, 0);
    ASSERT_EQ(f.load.tokens, f.tokens);
    const train::VisionBytes e = train::vision_bytes(config, f.load, mode, at::kFloat);
    std::printf("%s %s: %lld tokens, kept %lld (estimate %lld, %.3f), peak %lld (estimate %lld, %.3f)\n",
                GetParam().c_str(), model::to_string(mode), (long long)f.tokens, (long long)f.kept, (long long)e.kept,
                double(e.kept) / double(f.kept), (long long)f.peak, (long long)(e.kept + e.transient),
                double(e.kept + e.transient) / double(f.peak));
    EXPECT_GE(double(e.kept) / double(f.kept), 0.9);
    EXPECT_LE(double(e.kept) / double(f.kept), 1.2);
    EXPECT_GE(double(e.kept + e.transient) / double(f.peak), 0.9);
    EXPECT_LE(double(e.kept + e.transient) / double(f.peak), 1.2);
  }
}

// A rank with no items runs the tower on none (its hooks must fire as on the others); the
// tower does so whether or not its blocks are hooked, and a backward runs through it.
TEST_P(VisionMemory, EveryTowerEncodesNoItems) {
  const model::ModelConfig config =
      model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/" + GetParam() + ".json");
  const std::shared_ptr<model::Vlm> vlm = model::build_vlm(config);
  model::VisionTower& tower = vlm->tower();
  ASSERT_FALSE(tower.blocks().hooked());
  const at::Tensor rows = tower.encode(tower.no_items(at::TensorOptions().dtype(at::kFloat)));
  EXPECT_EQ(rows.sizes(), at::IntArrayRef({0, tower.row_width()}));
  rows.sum().backward();
  int64_t reached = 0;
  for (const auto& p : vlm->named_parameters())
    if (p.key().find("visual") != std::string::npos || p.key().find("vision") != std::string::npos)
      reached += p.value().grad().defined() ? 1 : 0;
  EXPECT_GT(reached, 0);
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, VisionMemory,
                         ::testing::Values("tiny-qwen2-vl", "tiny-qwen2_5-vl", "tiny-qwen3-vl", "tiny-qwen3_5-vl",
                                           "tiny-llava", "tiny-internvl"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-' || c == '.') c = '_';
                           return name;
                         });

}  // namespace
