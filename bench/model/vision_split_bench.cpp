// Vision-tower SP benchmark; see vision_split_bench.h.
#include "vision_split_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/family.h"
#include "mmsp/model/vlm.h"
#include "mmsp/parallel/vision_routing.h"
#include "mmsp/train/data/dataset.h"
#include "mmsp/train/data/step_pixels.h"
#include "mmsp/train/memory/memory_counter.h"
#include "mmsp/train/memory/vision_load.h"
#include "vlm_bench.h"

namespace mmsp::bench {
namespace {

using nlohmann::json;

// A square image up to 128 × 128 patches; beyond, a video of 64 × 64-patch frames.
plan::Grid grid_of(int64_t patches) {
  const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(double(patches))));
  if (patches <= 16384 && side * side == patches && side % 2 == 0) return {1, side, side};
  MMSP_CHECK(patches % 4096 == 0, "bench vision-split: ", patches,
             " patches is neither an even square up to 128² nor a multiple of 64 × 64 (a video's frames)");
  return {patches / 4096, 64, 64};
}

// One sequence per item: text, the item's block of placeholders, text.
plan::Batch batch_of(const std::vector<plan::Grid>& grids, const plan::ModelConventions& c) {
  plan::Batch batch;
  int i = 0;
  for (const plan::Grid& g : grids) {
    plan::Sequence s;
    const bool video = g[0] > 1;
    for (int t = 0; t < 16; ++t) s.input_ids.push_back((i * 37 + t * 11) % 900);
    s.input_ids.push_back(c.vision_start_token_id);
    const int64_t rows = plan::vision_row_count(g, c);
    for (int64_t r = 0; r < rows; ++r) s.input_ids.push_back(video ? c.video_token_id : c.image_token_id);
    s.input_ids.push_back(c.vision_end_token_id);
    for (int t = 0; t < 16; ++t) s.input_ids.push_back((i * 13 + t * 5) % 900);
    (video ? s.video_grid_thw : s.image_grid_thw).push_back(g);
    batch.sequences.push_back(s);
    ++i;
  }
  return batch;
}

// Pixels drawn per item from its own seed, as a decoder would make them.
class BenchItems : public train::Dataset {
 public:
  BenchItems(plan::Batch batch, int64_t patch_row) : batch_(std::move(batch)), patch_row_(patch_row) {}
  int64_t size() const override { return static_cast<int64_t>(batch_.sequences.size()); }
  plan::Sequence sequence(int64_t index) const override { return batch_.sequences.at(index); }
  at::Tensor image_pixels(int64_t index, int64_t image) const override {
    return draw(index, batch_.sequences.at(index).image_grid_thw.at(image));
  }
  at::Tensor video_pixels(int64_t index, int64_t video) const override {
    return draw(index, batch_.sequences.at(index).video_grid_thw.at(video));
  }
  std::string describe() const override { return "bench vision-split items"; }

 private:
  at::Tensor draw(int64_t index, const plan::Grid& g) const {
    at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(11 + index));
    return at::randn({g[0] * g[1] * g[2], patch_row_}, gen, at::kFloat);
  }
  plan::Batch batch_;
  int64_t patch_row_;
};

// Bytes context rank r sends for one split item of N patches, N_r of them its own, over S
// ranks, per block of a tower W wide: the forward's q, k, v each to the others' heads
// (N_r · W · (S−1)/S) and the output back ((N − N_r) · W/S), the backward the same
// exchanges mirrored.
double exchange_bytes(int64_t N, int64_t Nr, int S, int64_t W, int64_t depth, int64_t element) {
  const double scatter = double(Nr) * double(W) * (S - 1) / S, gather = double(N - Nr) * double(W) / S;
  return double(depth) * 4.0 * (scatter + gather) * double(element);
}

}  // namespace

json bench_vision_split(const dist::RankEnv& env, const VisionSplitBenchOptions& o) {
  MMSP_CHECK(o.repeats >= 1, "bench vision-split: --repeats must be >= 1, got ", o.repeats);
  MMSP_CHECK(!o.patches.empty(), "bench vision-split: give at least one --patches");
  train::MemoryCounter memory;
  at::set_num_threads(1);
  const model::ModelConfig config = bench_qwen2_vl_config();  // its vision heads, 4, divide by 2 and 4 ranks
  const model::QwenVisionConfig& vision = *model::qwen_vision_of(config);
  at::manual_seed(42);
  const std::shared_ptr<model::Vlm> built = model::build_vlm(config);
  model::Vlm& vlm = *built;
  const dist::Rendezvous met = dist::Mesh::rendezvous(env, std::chrono::seconds(120));
  const int S = env.world_size;
  json rows = json::array();
  int mesh_index = 0;
  for (const int64_t patches : o.patches) {
    const plan::Grid grid = grid_of(patches);
    const plan::Batch batch = batch_of({grid}, config.conventions);
    const BenchItems items(batch, vision.patch_row());
    const std::vector<int64_t> samples = {0};
    struct Setup {
      const char* name;
      int context;
      const char* split;
    };
    for (const Setup& setup :
         {Setup{"one rank", 1, "off"}, Setup{"Vision DP, whole", S, "off"}, Setup{"split", S, "1"}}) {
      dist::MeshOptions mo;
      mo.timeout = std::chrono::seconds(600);
      const plan::Mesh shape{S / setup.context, setup.context, 1};  // dp replicas of the same step
      dist::Mesh mesh = dist::Mesh::create(met, env, shape, mo, "vision-split-bench-" + std::to_string(mesh_index++));
      plan::PlanOptions po;
      po.mesh = {1, shape.ring, 1};
      po.vision_split = plan::parse_vision_split(setup.split);
      const int context_rank = mesh.coords().ring;
      const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, po, context_rank);
      const model::VisionMode mode = model::VisionMode::routed;
      double seconds = 0;
      int64_t peak = 0, held_pixels = 0;
      dist::CommSnapshot d;
      for (int run = 0; run < o.repeats; ++run) {
        vlm.zero_grad();
        // This rank's pixels as the trainer loads them (its shard of a split item), before
        // the measured window: the figure is the vision part's own.
        const model::PixelInputs pixels =
            train::load_pixels(items, samples, batch, config, train::pixels_encoded_here(plan, mode), at::kFloat);
        held_pixels = pixels.images.numel() + (pixels.videos.defined() ? pixels.videos.numel() : 0);
        const dist::CommSnapshot before = mesh.stats().snapshot();
        memory.reset_peak();
        const int64_t base = memory.current_bytes();
        const auto start = std::chrono::steady_clock::now();
        vlm.vision_rows(plan, pixels, parallel::vision_router(plan, mesh.context(), mode)).sum().backward();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        seconds = run == 0 ? s : std::min(seconds, s);
        peak = memory.peak_bytes() - base;
        d = mesh.stats().snapshot() - before;
      }
      // The formula: this rank's exchanges for the split item, the rows it sends to other
      // ranks (forward) and the gradients of the rows it received from them (backward), fp32.
      double formula = 0;
      const plan::VisionItem& item = plan.rows[0].items.at(0);
      if (item.split())
        formula += exchange_bytes(item.patches, item.rows_encoded_by(context_rank) * (item.patches / item.rows),
                                  setup.context, vision.hidden_size, vision.depth, 4);
      for (int other = 0; other < setup.context; ++other)
        if (other != context_rank)
          formula += double(plan.mine.routes.send[other].size() + plan.mine.routes.recv[other].size()) *
                     double(vlm.tower().row_width()) * 4;
      // The preflight's figure for this rank's load (train/memory/vision_load.h), less the
      // step's own pixels, which are held before the measured window.
      const std::vector<train::VisionLoad> loads = train::vision_loads(plan, mode);
      const train::VisionLoad& load = loads.at(static_cast<size_t>(context_rank));  // one dp row planned
      const double estimate =
          double(train::vision_bytes(config, load, model::ActivationCheckpointing::none, at::kFloat).total() -
                 held_pixels * 4);
      at::Tensor mine =
          at::tensor({double(peak), double(d.total_bytes()), formula, seconds, double(held_pixels), estimate},
                     at::kDouble)
              .view({1, 6});
      at::Tensor all = dist::all_gather_v(mine, std::vector<int64_t>(S, 1), mesh.world());
      at::Tensor max = std::get<0>(all.max(0));
      json per_rank = json::array();
      for (int r = 0; r < S; ++r)
        per_rank.push_back({{"peak_bytes", int64_t(all[r][0].item<double>())},
                            {"bytes_sent", int64_t(all[r][1].item<double>())},
                            {"bytes_formula", int64_t(all[r][2].item<double>())},
                            {"seconds", all[r][3].item<double>()},
                            {"pixel_values_held", int64_t(all[r][4].item<double>())},
                            {"estimate_bytes", int64_t(all[r][5].item<double>())}});
      bool bytes_equal = true;
      for (const json& r : per_rank) bytes_equal = bytes_equal && r["bytes_sent"] == r["bytes_formula"];
      rows.push_back({{"patches", patches},
                      {"grid_thw", {grid[0], grid[1], grid[2]}},
                      {"setup", setup.name},
                      {"context_ranks", setup.context},
                      {"split", item.split()},
                      {"peak_bytes_max_rank", int64_t(max[0].item<double>())},
                      {"estimate_bytes_max_rank", int64_t(max[5].item<double>())},
                      {"estimate_over_peak", max[5].item<double>() / std::max(1.0, max[0].item<double>())},
                      {"seconds_max_rank", max[3].item<double>()},
                      {"bytes_equal_formula", bytes_equal},
                      {"ranks", per_rank}});
      if (env.rank == 0)
        std::cerr << "bench vision-split: " << patches << " patches, " << setup.name << ": peak "
                  << rows.back()["peak_bytes_max_rank"] << " B, " << rows.back()["seconds_max_rank"] << " s"
                  << std::endl;
    }
  }
  json result = {{"part", "vision-split"},
                 {"model", "built-in qwen2_vl (vision 64 wide, 4 heads, 2 blocks)"},
                 {"world", S},
                 {"dtype", "float32"},
                 {"repeats", o.repeats},
                 {"rows", rows},
                 {"bytes_formula",
                  "per split item and rank r: depth · 4 · (N_r · W · (S−1)/S + (N − N_r) · W/S) · 4 B "
                  "(q, k, v to the others' heads and the output back, forward and backward), plus "
                  "(rows sent to other ranks + rows received from them) · row width · 4 B (the rows "
                  "forward, their gradients backward)"},
                 {"estimate",
                  "the preflight's vision part for the rank's load (train/memory/vision_load.h: kept + "
                  "one block's transient), less the step's pixels, held before the measured window"}};
  json ratios = json::object();
  for (const int64_t patches : o.patches) {
    const json *one = nullptr, *whole = nullptr, *split = nullptr;
    for (const json& r : rows) {
      if (r["patches"] != patches) continue;
      const std::string name = r["setup"];
      (name == "one rank" ? one : name == "split" ? split : whole) = &r;
    }
    if (!one || !whole || !split) continue;
    auto ratio = [](const json* a, const json* b, const char* key) {
      return a->at(key).get<double>() / b->at(key).get<double>();
    };
    ratios[std::to_string(patches)] = {{"split_peak_over_one_rank", ratio(split, one, "peak_bytes_max_rank")},
                                       {"whole_peak_over_one_rank", ratio(whole, one, "peak_bytes_max_rank")},
                                       {"split_seconds_over_vision_dp", ratio(split, whole, "seconds_max_rank")}};
  }
  result["ratios"] = ratios;
  // The mixed batch, planned: one giant item beside many small ones.
  std::vector<plan::Grid> grids = {grid_of(o.patches[0])};
  for (int i = 0; i < o.small_items; ++i) grids.push_back({1, 32, 32});
  const plan::Batch mixed = batch_of(grids, config.conventions);
  json mixed_rows = json::object();
  for (const char* rule : {"off", "auto"}) {
    plan::PlanOptions po;
    po.mesh = {1, S, 1};
    po.vision_split = plan::parse_vision_split(rule);
    const plan::StepPlan p = plan::make_step_plan(mixed, config.conventions, po, 0);
    mixed_rows[rule] = {{"encoder_cost_max_over_mean", p.rows[0].load.vision_ratio},
                        {"split_items", p.rows[0].load.split_items},
                        {"encoder_cost", p.rows[0].load.vision_cost}};
  }
  result["mixed_batch"] = {{"items", json::array({{{"grid_thw", {grids[0][0], grids[0][1], grids[0][2]}}, {"count", 1}},
                                                  {{"grid_thw", {1, 32, 32}}, {"count", o.small_items}}})},
                           {"ranks", S},
                           {"planned", mixed_rows}};
  return result;
}

}  // namespace mmsp::bench
