// bench_plan: one rank's StepPlan for a 1,000,000-token batch with 2,000 images on a
// 64-rank context group (target: under 10 ms on one core). The batch is built once;
// the timed part is everything a rank does per step: parse, positions, packing, shard
// map, Vision DP, load report, and its own slots and routes.
#include <benchmark/benchmark.h>

#include <random>

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

void run(benchmark::State& state, ModelFamily family, Layout layout, int ring, int ulysses) {
  const ModelConventions c = default_conventions(family);
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

}  // namespace

BENCHMARK_CAPTURE(run, qwen2_vl_zigzag_r8_u8, ModelFamily::qwen2_vl, Layout::zigzag, 8, 8)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, qwen2_vl_zigzag_r64_u1, ModelFamily::qwen2_vl, Layout::zigzag, 64, 1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, qwen2_vl_contiguous_r8_u8, ModelFamily::qwen2_vl, Layout::contiguous, 8, 8)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, qwen3_vl_zigzag_r8_u8, ModelFamily::qwen3_vl, Layout::zigzag, 8, 8)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
