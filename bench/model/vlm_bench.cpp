// VLM memory/traffic benchmark; see vlm_bench.h.
#include "vlm_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/family.h"
#include "mmsp/model/vlm.h"
#include "mmsp/parallel/step_parallelism.h"
#include "mmsp/train/data/dataset.h"
#include "mmsp/train/data/step_pixels.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "mmsp/train/memory/memory_counter.h"

namespace mmsp::bench {
namespace {

using nlohmann::json;

}  // namespace

model::ModelConfig bench_qwen2_vl_config() {
  json c = {{"model_type", "qwen2_vl"},
            {"vocab_size", 1000},
            {"hidden_size", 128},
            {"intermediate_size", 256},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 8},
            {"num_key_value_heads", 2},
            {"rope_theta", 10000.0},
            {"tie_word_embeddings", false},
            {"vision_start_token_id", 990},
            {"vision_end_token_id", 991},
            {"vision_token_id", 992},
            {"image_token_id", 993},
            {"video_token_id", 994},
            {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {4, 2, 2}}}},
            {"vision_config",
             {{"depth", 2},
              {"embed_dim", 64},
              {"hidden_size", 128},
              {"num_heads", 4},
              {"mlp_ratio", 4},
              {"patch_size", 14},
              {"spatial_merge_size", 2},
              {"temporal_patch_size", 2},
              {"in_chans", 3}}}};
  return model::parse_model_config(c, "bench qwen2_vl");
}

namespace {

// One image per sequence between text, laid out as the family's processor writes it
// (its grid for the image size, its placeholder rows and markers). The size: --image-width
// x --image-height pixels as a file of that size (InternVL: its dynamic tiling); else the
// family's fixed side (LLaVA); else image_side patches per side.
plan::Batch bench_batch(const VlmBenchOptions& o, const model::ModelConfig& config,
                        const model::PixelGeometry& geometry) {
  const plan::ModelConventions& c = config.conventions;
  int64_t width = o.image_width, height = o.image_height;
  if (width == 0 && height == 0) width = height = geometry.fixed_side();
  if (width == 0 && height == 0) width = height = o.image_side / c.spatial_merge_size * geometry.side_unit();
  MMSP_CHECK(width > 0 && height > 0, "mmsp bench: give both --image-width and --image-height (pixels), got ", width,
             " x ", height);
  const plan::Grid grid = geometry.grid_for(1, width, height, detail::concat("a ", width, " x ", height, " image"));
  const int64_t rows = geometry.placeholder_rows(grid);
  const int64_t words = std::min<int64_t>(900, config.text.vocab_size);
  plan::Batch batch;
  for (int i = 0; i < o.images; ++i) {
    plan::Sequence s;
    for (int t = 0; t < 20 + 7 * (i % 3); ++t) s.input_ids.push_back((i * 37 + t * 11) % words);
    if (c.has_block_markers()) s.input_ids.push_back(c.vision_start_token_id);
    for (int64_t r = 0; r < rows; ++r) s.input_ids.push_back(c.image_token_id);
    if (c.has_block_markers()) s.input_ids.push_back(c.vision_end_token_id);
    for (int t = 0; t < 20; ++t) s.input_ids.push_back((i * 13 + t * 5) % words);
    s.image_grid_thw = {grid};
    batch.sequences.push_back(s);
  }
  return batch;
}

// The batch as a dataset: each image's pixels (in the family's layout) drawn from its
// own seed, as a decoder would make them, so a rank loads only the images it encodes
// (train::load_pixels).
class BenchImages : public train::Dataset {
 public:
  BenchImages(plan::Batch batch, std::shared_ptr<const model::PixelGeometry> geometry)
      : batch_(std::move(batch)), geometry_(std::move(geometry)) {}
  int64_t size() const override { return static_cast<int64_t>(batch_.sequences.size()); }
  plan::Sequence sequence(int64_t index) const override { return batch_.sequences.at(index); }
  at::Tensor image_pixels(int64_t index, int64_t image) const override {
    const plan::Grid& g = batch_.sequences.at(index).image_grid_thw.at(image);
    at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(7 + index));
    return at::randn(geometry_->item_shape(g), gen, at::kFloat);
  }
  at::Tensor video_pixels(int64_t, int64_t) const override { return {}; }
  std::string describe() const override { return "bench images"; }

 private:
  plan::Batch batch_;
  std::shared_ptr<const model::PixelGeometry> geometry_;
};

// Whether the model's heads split over `ulysses` ranks (attention and Gated DeltaNet).
bool heads_split(const model::TextConfig& text, int ulysses) {
  bool linear = false;
  for (int64_t i = 0; i < text.num_hidden_layers; ++i)
    linear |= text.layer_kind(i) == model::LayerKind::linear_attention;
  return text.num_attention_heads % ulysses == 0 &&
         (!linear || (text.linear_num_key_heads % ulysses == 0 && text.linear_num_value_heads % ulysses == 0));
}

}  // namespace

json bench_vlm(const dist::RankEnv& env, const VlmBenchOptions& o) {
  MMSP_CHECK(o.repeats >= 1, "bench vision/step: --repeats must be >= 1, got ", o.repeats);
  train::MemoryCounter memory;  // this benchmark's tensors, from here on
  at::set_num_threads(1);
  const model::ModelConfig config = o.model.empty() ? bench_qwen2_vl_config() : model::load_model_config(o.model);
  const std::shared_ptr<const model::PixelGeometry> geometry = model::pixel_geometry(config);
  const plan::Batch batch = bench_batch(o, config, *geometry);
  const BenchImages images(batch, geometry);
  std::vector<int64_t> samples(batch.sequences.size());
  for (size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<int64_t>(i);
  at::manual_seed(42);
  const std::shared_ptr<model::Vlm> built = model::build_vlm(config);  // the family's registry entry
  model::Vlm& vlm = *built;
  const dist::Rendezvous met = dist::Mesh::rendezvous(env, std::chrono::seconds(120));
  json rows = json::array();
  int mesh_index = 0;
  // Context groups of c ranks as a ring (zigzag cuts every segment in 2c chunks, so
  // images straddle ranks) and as Ulysses (each rank holds whole stretches).
  for (int c : {1, 2, 4})
    for (bool ring : {true, false}) {
      if (env.world_size % c || (c == 1 && !ring) || !heads_split(config.text, ring ? 1 : c)) continue;
      dist::MeshOptions mo;
      mo.timeout = std::chrono::seconds(300);
      // Each group of c ranks runs the whole batch: dp replicas of the same step.
      const plan::Mesh shape{env.world_size / c, ring ? c : 1, ring ? 1 : c};
      dist::Mesh mesh = dist::Mesh::create(met, env, shape, mo, "vlm-bench-" + std::to_string(mesh_index++));
      plan::PlanOptions po;
      po.mesh = {1, shape.ring, shape.ulysses};
      const int context_rank = mesh.coords().ring * shape.ulysses + mesh.coords().ulysses;
      const plan::StepPlan plan = plan::make_step_plan(batch, config.conventions, po, context_rank);
      const parallel::StepGroups groups{mesh.context(), mesh.ring(), mesh.ulysses()};
      for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
        double seconds = 0;
        int64_t peak = 0;
        dist::CommSnapshot d;
        for (int run = 0; run < o.repeats; ++run) {  // the figures of the last run, the fastest run's seconds
          vlm.zero_grad();
          const dist::CommSnapshot before = mesh.stats().snapshot();
          memory.reset_peak();
          const int64_t base = memory.current_bytes();
          const auto start = std::chrono::steady_clock::now();
          // This rank's pixels, as the trainer loads them: the items it encodes.
          const model::PixelInputs pixels =
              train::load_pixels(images, samples, batch, config, train::pixels_encoded_here(plan, mode), at::kFloat);
          if (o.step) {
            auto out = parallel::forward_step(vlm, batch, plan, pixels, groups, mode);
            train::causal_lm_loss(out.logits(), out.labels, out.label_count).backward();
          } else {
            vlm.vision_rows(plan, pixels, parallel::vision_router(plan, groups.context, mode)).sum().backward();
          }
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          seconds = run == 0 ? s : std::min(seconds, s);
          peak = memory.peak_bytes() - base;
          d = mesh.stats().snapshot() - before;
        }
        int64_t vision_bytes = 0;
        for (auto kind : {dist::CommKind::all_to_all_v, dist::CommKind::all_gather_v})
          for (auto pass : {dist::Pass::forward, dist::Pass::backward}) vision_bytes += d.at(kind, pass).bytes;
        // Every rank's figures, to report the largest.
        at::Tensor mine = at::tensor({static_cast<double>(peak), static_cast<double>(vision_bytes),
                                      static_cast<double>(d.total_bytes()), seconds},
                                     at::kDouble)
                              .view({1, 4});
        at::Tensor all = dist::all_gather_v(mine, std::vector<int64_t>(env.world_size, 1), mesh.world());
        at::Tensor max = std::get<0>(all.max(0));
        at::Tensor mean = all.mean(0);
        rows.push_back({{"context_ranks", c},
                        {"ring", shape.ring},
                        {"ulysses", shape.ulysses},
                        {"mode", model::to_string(mode)},
                        {"peak_bytes_max_rank", static_cast<int64_t>(max[0].item<double>())},
                        {"vision_bytes_max_rank", static_cast<int64_t>(max[1].item<double>())},
                        {"vision_bytes_mean_rank", mean[1].item<double>()},
                        {"all_bytes_max_rank", static_cast<int64_t>(max[2].item<double>())},
                        {"seconds_max_rank", max[3].item<double>()}});
      }
    }
  const plan::Grid& grid = batch.sequences.at(0).image_grid_thw.at(0);
  json result = {{"part", o.step ? "step" : "vision"},
                 {"model", o.model.empty() ? "built-in qwen2_vl" : o.model},
                 {"model_type", config.model_type},
                 {"repeats", o.repeats},
                 {"images", o.images},
                 {"image_grid", {grid[0], grid[1], grid[2]}},
                 {"image_patches", grid[0] * grid[1] * grid[2]},
                 {"dtype", "float32"},
                 {"rows", rows}};
  auto find = [&](int c, const std::string& mode) -> const json* {  // ring meshes
    for (const json& r : rows)
      if (r["context_ranks"] == c && r["ring"] == c && r["mode"] == mode) return &r;
    return nullptr;
  };
  const json *r1 = find(1, "routed"), *r4 = find(4, "routed"), *g4 = find(4, "gather");
  if (r1 && r4 && g4) {
    result["routed_peak_4_over_1"] =
        r4->at("peak_bytes_max_rank").get<double>() / r1->at("peak_bytes_max_rank").get<double>();
    result["routed_vision_bytes_over_gather_4"] =
        r4->at("vision_bytes_max_rank").get<double>() / g4->at("vision_bytes_max_rank").get<double>();
    result["routed_vision_bytes_over_gather_4_mean"] =
        r4->at("vision_bytes_mean_rank").get<double>() / g4->at("vision_bytes_mean_rank").get<double>();
  }
  return result;
}

}  // namespace mmsp::bench
