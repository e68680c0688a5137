// bench_plan: one rank's StepPlan for a 1,000,000-token batch with 2,000 images on a
// 64-rank context group (target: under 10 ms on one core). The batch is built once;
// the timed part is everything a rank does per step: parse, positions, packing, shard
// map, Vision DP, load report, and its own slots and routes.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "mmsp/model/family.h"
#include "mmsp/plan/step_plan.h"

namespace {

using namespace mmsp::plan;

// 200 sequences of 5,000 tokens, each with 10 images of 8x8..20x20 merged rows.
Batch make_batch(const ModelConventions& c) {
  std::mt19937 rng(1);
  Batch batch;
  const int sequences = 200, images = 10;
  const int64_t length = 5000;
  for (int s = 0; s < sequences; ++s) {
    Sequence seq;
    std::vector<int64_t> rows;
    int64_t vision = 0;
    for (int i = 0; i < images; ++i) {
      const int64_t h = 2 * std::uniform_int_distribution<int64_t>(8, 20)(rng);
      const int64_t w = 2 * std::uniform_int_distribution<int64_t>(8, 20)(rng);
      seq.image_grid_thw.push_back({1, h, w});
      rows.push_back((h / 2) * (w / 2));
      vision += rows.back() + 2;
    }
    const int64_t text = length - vision;
    const int64_t per_gap = text / (images + 1);
    for (int i = 0; i <= images; ++i) {
      const int64_t n = i == images ? text - per_gap * images : per_gap;
      for (int64_t k = 0; k < n; ++k) seq.input_ids.push_back(100 + (k % 1000));
      if (i == images) break;
      seq.input_ids.push_back(c.vision_start_token_id);
      for (int64_t k = 0; k < rows[i]; ++k) seq.input_ids.push_back(c.image_token_id);
      seq.input_ids.push_back(c.vision_end_token_id);
    }
    batch.sequences.push_back(std::move(seq));
  }
  return batch;
}

void run(benchmark::State& state, const char* model_type, Layout layout, int ring, int ulysses) {
  const ModelConventions c = mmsp::model::conventions_from_config(nlohmann::json{{"model_type", model_type}});
  const Batch batch = make_batch(c);
  PlanOptions o;
  o.mesh = {1, ring, ulysses};
  o.layout = layout;
  const int rank = 37 % (ring * ulysses);
  int64_t tokens = 0;
  for (const Sequence& s : batch.sequences) tokens += static_cast<int64_t>(s.input_ids.size());
  double vision_ratio = 0, greedy_ratio = 0;
  for (auto _ : state) {
    StepPlan plan = make_step_plan(batch, c, o, rank);
    benchmark::DoNotOptimize(plan.mine.positions.data());
    vision_ratio = plan.rows[0].load.vision_ratio;
    greedy_ratio = plan.rows[0].load.greedy_vision_ratio;
  }
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["vision_max_over_mean"] = vision_ratio;
  state.counters["greedy_max_over_mean"] = greedy_ratio;
}

// Vision DP balance on its own: ours vs the Python patches' greedy contiguous rule, both
// measured as max/mean of the same estimated encoder cost (docs/plan.md quotes these).
// items: images of 8..64 patches a side (even), every `video_every`-th a video of
// 4..16 temporal patches; 20 random batches, the mean and worst ratios reported.
void vision_dp(benchmark::State& state, int ranks, int items, int video_every) {
  VisionCostModel model;
  std::mt19937 rng(42);
  std::vector<std::vector<double>> costs(20);
  std::vector<std::vector<int64_t>> patches(20);
  for (int b = 0; b < 20; ++b) {
    for (int i = 0; i < items; ++i) {
      const int64_t h = 2 * std::uniform_int_distribution<int64_t>(4, 32)(rng);
      const int64_t w = 2 * std::uniform_int_distribution<int64_t>(4, 32)(rng);
      const int64_t t =
          video_every > 0 && i % video_every == 0 ? std::uniform_int_distribution<int64_t>(4, 16)(rng) : 1;
      costs[b].push_back(encoder_cost({t, h, w}, model));
      patches[b].push_back(t * h * w);
    }
  }
  // No whole-item assignment beats max(largest item, mean load) / mean load.
  double bound_sum = 0;
  for (int b = 0; b < 20; ++b) {
    double total = 0, largest = 0;
    for (double c : costs[b]) total += c, largest = std::max(largest, c);
    bound_sum += std::max(largest, total / ranks) / (total / ranks);
  }
  double ours_sum = 0, greedy_sum = 0, ours_worst = 0, greedy_worst = 0;
  for (auto _ : state) {
    ours_sum = greedy_sum = ours_worst = greedy_worst = 0;
    for (int b = 0; b < 20; ++b) {
      const std::vector<int> none(costs[b].size(), -1);
      const double ours = assign_vision_balanced(costs[b], patches[b], none, ranks, model).max_over_mean;
      const double greedy =
          evaluate_assignment(assign_greedy_contiguous(patches[b], ranks), costs[b], ranks).max_over_mean;
      ours_sum += ours;
      greedy_sum += greedy;
      ours_worst = std::max(ours_worst, ours);
      greedy_worst = std::max(greedy_worst, greedy);
    }
  }
  state.counters["bound_mean"] = bound_sum / 20;
  state.counters["ours_mean"] = ours_sum / 20;
  state.counters["ours_worst"] = ours_worst;
  state.counters["greedy_mean"] = greedy_sum / 20;
  state.counters["greedy_worst"] = greedy_worst;
}

}  // namespace

BENCHMARK_CAPTURE(vision_dp, images_32_on_8, 8, 32, 0)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(vision_dp, mixed_64_on_8, 8, 64, 8)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(vision_dp, images_256_on_64, 64, 256, 0)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(vision_dp, mixed_512_on_64, 64, 512, 16)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, qwen2_vl_zigzag_r8_u8, "qwen2_vl", Layout::zigzag, 8, 8)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, qwen2_vl_zigzag_r64_u1, "qwen2_vl", Layout::zigzag, 64, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, qwen2_vl_contiguous_r8_u8, "qwen2_vl", Layout::contiguous, 8, 8)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, qwen3_vl_zigzag_r8_u8, "qwen3_vl", Layout::zigzag, 8, 8)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
