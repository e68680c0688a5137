// VLM memory/traffic benchmark; see vlm_bench.h.
#include "vlm_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/family.h"
#include "mmsp/model/vlm.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/train/memory_counter.h"

namespace mmsp::bench {
namespace {

using nlohmann::json;

model::ModelConfig bench_config() {
  json c = {{"model_type", "qwen2_vl"}, {"vocab_size", 1000}, {"hidden_size", 128},
            {"intermediate_size", 256}, {"num_hidden_layers", 2}, {"num_attention_heads", 8},
            {"num_key_value_heads", 2}, {"rope_theta", 10000.0}, {"tie_word_embeddings", false},
            {"vision_start_token_id", 990}, {"vision_end_token_id", 991}, {"vision_token_id", 992},
            {"image_token_id", 993}, {"video_token_id", 994},
            {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {4, 2, 2}}}},
            {"vision_config", {{"depth", 2}, {"embed_dim", 64}, {"hidden_size", 128}, {"num_heads", 4},
                               {"mlp_ratio", 4}, {"patch_size", 14}, {"spatial_merge_size", 2},
                               {"temporal_patch_size", 2}, {"in_chans", 3}}}};
  return model::parse_model_config(c, "bench qwen2_vl");
}

// One image of `o`'s size per sequence, between text: the placeholders and pixels come
// from the family's geometry, so every family gets the same batch.
struct BenchInputs {
  plan::Batch batch;
  model::PixelInputs pixels;
};

BenchInputs bench_inputs(const VlmBenchOptions& o, const model::ModelConfig& config) {
  const std::shared_ptr<const model::PixelGeometry> geometry = model::pixel_geometry(config);
  int64_t width = o.image_width, height = o.image_height;
  if (o.model.empty()) width = height = o.image_side * config.qwen_vision->patch_size;
  if (width == 0 && height == 0) width = height = geometry->fixed_side();
  MMSP_CHECK(width > 0 && height > 0, "mmsp bench --model ", o.model, ": ", config.model_type,
             " has no fixed image size; give --image-width and --image-height (pixels), got ", width, " x ", height);
  const plan::Grid grid = geometry->grid_for(1, width, height, detail::concat("a ", width, " x ", height, " image"));
  const int64_t rows = geometry->placeholder_rows(grid);
  const plan::ModelConventions& c = config.conventions;
  BenchInputs in;
  for (int i = 0; i < o.images; ++i) {
    plan::Sequence s;
    for (int t = 0; t < 20 + 7 * (i % 3); ++t) s.input_ids.push_back((i * 37 + t * 11) % 900);
    if (c.has_block_markers()) s.input_ids.push_back(c.vision_start_token_id);
    for (int64_t r = 0; r < rows; ++r) s.input_ids.push_back(c.image_token_id);
    if (c.has_block_markers()) s.input_ids.push_back(c.vision_end_token_id);
    for (int t = 0; t < 20; ++t) s.input_ids.push_back((i * 13 + t * 5) % 900);
    s.image_grid_thw = {grid};
    in.batch.sequences.push_back(s);
  }
  std::vector<int64_t> shape = geometry->row_shape();
  shape.insert(shape.begin(), o.images * geometry->batch_rows(grid));
  at::manual_seed(7);
  in.pixels.images = at::randn(shape);
  return in;
}

}  // namespace

json bench_vlm(const dist::RankEnv& env, const VlmBenchOptions& o) {
  train::MemoryCounter::install();
  at::set_num_threads(1);
  const model::ModelConfig config = o.model.empty() ? bench_config() : model::load_model_config(o.model);
  const BenchInputs inputs = bench_inputs(o, config);
  const plan::Batch& batch = inputs.batch;
  const model::PixelInputs& pixels = inputs.pixels;
  at::manual_seed(42);
  const std::shared_ptr<model::Vlm> built = model::build_vlm(config);  // the family's registry entry
  model::Vlm& vlm = *built;
  auto store = dist::Mesh::open_store(env, std::chrono::seconds(120));
  json rows = json::array();
  int mesh_index = 0;
  // Context groups of c ranks as a ring (zigzag cuts every segment in 2c chunks, so
  // images straddle ranks) and as Ulysses (each rank holds whole stretches).
  for (int c : {1, 2, 4})
  for (bool ring : {true, false}) {
    if (env.world_size % c || (c == 1 && !ring)) continue;
    dist::MeshOptions mo;
    mo.timeout = std::chrono::seconds(300);
    // Each group of c ranks runs the whole batch: dp replicas of the same step.
    const plan::Mesh shape{env.world_size / c, ring ? c : 1, ring ? 1 : c};
    dist::Mesh mesh = dist::Mesh::create(store, env, shape, mo, "vlm-bench-" + std::to_string(mesh_index++));
    plan::PlanOptions po;
    po.mesh = {1, shape.ring, shape.ulysses};
    const int context_rank = mesh.coords().ring * shape.ulysses + mesh.coords().ulysses;
    const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, po, context_rank);
    const model::StepGroups groups{mesh.context(), mesh.ring(), mesh.ulysses()};
    for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
      vlm.zero_grad();
      const dist::CommSnapshot before = mesh.stats().snapshot();
      train::MemoryCounter::reset_peak();
      const int64_t base = train::MemoryCounter::current_bytes();
      if (o.step) {
        auto out = vlm.forward(batch, plan, pixels, groups, mode);
        model::causal_lm_loss(out.logits(), out.labels, out.label_count).backward();
      } else {
        vlm.vision_rows(plan, pixels, groups, mode).sum().backward();
      }
      const int64_t peak = train::MemoryCounter::peak_bytes() - base;
      const dist::CommSnapshot d = mesh.stats().snapshot() - before;
      int64_t vision_bytes = 0;
      for (auto kind : {dist::CommKind::all_to_all_v, dist::CommKind::all_gather_v})
        for (auto pass : {dist::Pass::forward, dist::Pass::backward}) vision_bytes += d.at(kind, pass).bytes;
      // Every rank's figures, to report the largest.
      at::Tensor mine = at::tensor({peak, vision_bytes, d.total_bytes()}, at::kLong).view({1, 3});
      at::Tensor all = dist::all_gather_v(mine, std::vector<int64_t>(env.world_size, 1), mesh.world());
      at::Tensor max = std::get<0>(all.max(0));
      at::Tensor mean = all.to(at::kDouble).mean(0);
      rows.push_back({{"context_ranks", c}, {"ring", shape.ring}, {"ulysses", shape.ulysses},
                      {"mode", model::to_string(mode)},
                      {"peak_bytes_max_rank", max[0].item<int64_t>()},
                      {"vision_bytes_max_rank", max[1].item<int64_t>()},
                      {"vision_bytes_mean_rank", mean[1].item<double>()},
                      {"all_bytes_max_rank", max[2].item<int64_t>()}});
    }
  }
  const plan::Grid& grid = batch.sequences.at(0).image_grid_thw.at(0);
  json result = {{"part", o.step ? "step" : "vision"}, {"model", config.model_type}, {"images", o.images},
                 {"image_grid", {grid[0], grid[1], grid[2]}}, {"image_patches", grid[0] * grid[1] * grid[2]},
                 {"dtype", "float32"}, {"rows", rows}};
  auto find = [&](int c, const std::string& mode) -> const json* {  // ring meshes
    for (const json& r : rows)
      if (r["context_ranks"] == c && r["ring"] == c && r["mode"] == mode) return &r;
    return nullptr;
  };
  const json *r1 = find(1, "routed"), *r4 = find(4, "routed"), *g4 = find(4, "gather");
  if (r1 && r4 && g4) {
    result["routed_peak_4_over_1"] = r4->at("peak_bytes_max_rank").get<double>() /
                                     r1->at("peak_bytes_max_rank").get<double>();
    result["routed_vision_bytes_over_gather_4"] =
        r4->at("vision_bytes_max_rank").get<double>() / g4->at("vision_bytes_max_rank").get<double>();
    result["routed_vision_bytes_over_gather_4_mean"] =
        r4->at("vision_bytes_mean_rank").get<double>() / g4->at("vision_bytes_mean_rank").get<double>();
  }
  return result;
}

}  // namespace mmsp::bench
