// `mmsp bench memory`; see memory_bench.h.
#include "memory_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/parallel/zero/shard_level.h"
#include "mmsp/train/trainer.h"

namespace mmsp::bench {
namespace {

using nlohmann::json;

// The flags of one row: each adds one memory feature to the row before it.
struct Setting {
  const char* shard;
  model::ActivationCheckpointing checkpointing;
  bool chunked;
  bool tiled_mlp = false;  // --tiled-mlp auto
  bool offload = false;    // --offload-activations (saves device memory only off the host)
};
constexpr Setting kSettings[] = {
    {"none", model::ActivationCheckpointing::none, false},
    {"none", model::ActivationCheckpointing::none, true},
    {"none", model::ActivationCheckpointing::decoder, true},
    {"optimizer", model::ActivationCheckpointing::decoder, true},
    {"gradients", model::ActivationCheckpointing::decoder, true},
    {"parameters", model::ActivationCheckpointing::decoder, true},
    {"parameters", model::ActivationCheckpointing::all, true},
    {"parameters", model::ActivationCheckpointing::all, true, true},
    {"parameters", model::ActivationCheckpointing::all, true, true, true},
};

// A row's flags on a run's options (and the fine-tuning flags every row shares).
void apply(const Setting& setting, train::TrainOptions& t, const MemoryBenchOptions& o) {
  t.finetune.freeze = model::parse_model_parts(o.freeze, "--freeze");
  t.finetune.lora.rank = o.lora_rank;
  t.parallel.shard = parallel::parse_shard_level(setting.shard);
  t.memory.checkpoint_activations = setting.checkpointing;
  t.memory.tiled_mlp = setting.tiled_mlp ? model::kAutoMlpTile : 0;
  t.memory.offload_activations = setting.offload;
}

json setting_fields(const Setting& setting, const MemoryBenchOptions& o) {
  return {{"freeze", o.freeze},
          {"lora_rank", o.lora_rank},
          {"shard", setting.shard},
          {"checkpoint_activations", model::to_string(setting.checkpointing)},
          {"tiled_mlp", setting.tiled_mlp ? "auto" : "off"},
          {"offload_activations", setting.offload}};
}

// Each rank's value, on every rank.
std::vector<int64_t> every_rank(int64_t mine, const dist::Mesh& mesh) {
  at::Tensor all = dist::all_gather_v(at::full({1}, static_cast<double>(mine), at::kDouble),
                                      std::vector<int64_t>(mesh.world_size(), 1), mesh.world());
  std::vector<int64_t> out;
  for (int64_t r = 0; r < all.numel(); ++r) out.push_back(static_cast<int64_t>(all[r].item<double>()));
  return out;
}

}  // namespace

// The longest sequence a device of each capacity holds, by the preflight's estimate.
json longest_sequences(const std::vector<std::string>& models, const std::vector<std::string>& paths,
                       const MemoryBenchOptions& o, int world, const std::function<bool(const Setting&)>& wanted) {
  json rows = json::array();
  for (size_t i = 0; i < models.size(); ++i) {
    model::ModelConfig config = model::load_model_config(paths[i]);
    model::set_expert_shard(config.text.moe, o.expert, 0);  // a rank's experts (every block holds as many)
    for (int64_t capacity : o.longest_bytes)
      for (const Setting& setting : kSettings) {
        if (!wanted(setting) || (config.text.moe.any() && setting.tiled_mlp)) continue;  // MoE layers: untiled
        train::TrainOptions t;
        t.inputs.dtype = train::parse_compute_dtype(o.dtype);
        apply(setting, t, o);
        t.parallel.device = c10::Device(c10::kCUDA, 0);  // the capacities are a GPU's: offloaded inputs leave it
        t.memory.loss_chunk = setting.chunked ? o.loss_chunk : -1;  // unchunked: one chunk of all T
        json row = {{"model", models[i]},
                    {"layers", o.scale.layers},
                    {"ranks", world},
                    {"dtype", o.dtype},
                    {"loss_chunk", setting.chunked ? "default" : "off"},
                    {"capacity_bytes", capacity},
                    {"ring", o.longest_ring > 0 ? o.longest_ring : world},
                    {"expert", o.expert},
                    {"longest_tokens_per_rank",
                     train::longest_tokens_per_rank(config, t, world, capacity, 256, o.longest_ring)}};
        row.update(setting_fields(setting, o));
        rows.push_back(row);
      }
  }
  return {{"benchmark", "memory-longest"},
          {"note", "the preflight's estimate (blockwise attention's working set), not a measurement"},
          {"rows", rows}};
}

json bench_memory(const dist::RankEnv& env, const MemoryBenchOptions& o) {
  for (const std::string& level : o.shards) parallel::parse_shard_level(level);  // names the bad one
  std::vector<std::string> paths;  // scaled before the first collective: a bad scale fails every rank alike
  for (size_t i = 0; i < o.models.size(); ++i)
    paths.push_back(scaled_config(o.models[i], o.scale, std::to_string(env.rank) + "-" + std::to_string(i)));
  auto wanted = [&](const Setting& s) {
    const std::string mode = model::to_string(s.checkpointing);
    return (o.shards.empty() || std::find(o.shards.begin(), o.shards.end(), s.shard) != o.shards.end()) &&
           (o.checkpointing.empty() ||
            std::find(o.checkpointing.begin(), o.checkpointing.end(), mode) != o.checkpointing.end());
  };
  if (!o.longest_bytes.empty()) {
    json result = longest_sequences(o.models, paths, o, o.longest_ranks > 0 ? o.longest_ranks : env.world_size, wanted);
    for (size_t i = 0; i < o.models.size(); ++i)
      if (paths[i] != o.models[i]) std::filesystem::remove(paths[i]);
    return result;
  }
  at::set_num_threads(1);
  const dist::Rendezvous met = dist::Mesh::rendezvous(env, std::chrono::seconds(120));
  dist::MeshOptions mesh_options;
  mesh_options.timeout = std::chrono::seconds(600);
  mesh_options.gpu_collectives = o.gpu_collectives;
  // All ranks in one ring (zigzag): the sequence split world ways.
  const dist::Mesh mesh =
      dist::Mesh::create(met, env, plan::Mesh{1, env.world_size, 1, o.expert}, mesh_options, "memory-bench");
  json rows = json::array();
  for (size_t i = 0; i < o.models.size(); ++i) {
    const std::string& model = o.models[i];
    const std::string& path = paths[i];
    const bool experts = model::load_model_config(path).text.moe.any();
    for (const Setting& setting : kSettings) {
      if (!wanted(setting) || (experts && setting.tiled_mlp)) continue;  // MoE layers are not tiled
      train::TrainOptions t;
      t.inputs.model = path;
      t.inputs.dtype = train::parse_compute_dtype(o.dtype);
      t.schedule.steps = o.steps;
      t.inputs.tokens_per_rank = o.tokens_per_rank;
      apply(setting, t, o);
      t.memory.loss_chunk = setting.chunked ? o.loss_chunk : o.tokens_per_rank;  // unchunked: one chunk of all T
      t.memory.limit_bytes = 0;
      t.output.quiet = true;
      t.output.report_parameters = false;
      t.parallel.device = o.device;
      t.parallel.attention_kernel = attention::parse_attention_kernel(o.attention_kernel);
      std::ostringstream log;
      const train::TrainReport report = train::train(t, mesh, log);
      const train::StepMetrics& last = report.steps.back();
      const train::MemoryEstimate& e = report.memory_estimate;
      json row = {
          {"model", model},
          {"layers", o.scale.layers},
          {"vision_layers", o.scale.vision_layers},
          {"vocab", o.scale.vocab},
          {"ranks", env.world_size},
          {"expert", o.expert},
          {"tokens_per_rank", o.tokens_per_rank},
          {"dtype", o.dtype},
          {"loss_chunk", setting.chunked ? (o.loss_chunk > 0 ? std::to_string(o.loss_chunk) : "default") : "off"},
          {"parameters", e.parameter_count},
          {"measured",
           {{"step_peak_bytes", last.peak_bytes},               // largest of any rank
            {"update_peak_bytes", last.update_peak_bytes},      // the same, in the weight update,
            {"forward_peak_bytes", last.forward_peak_bytes},    // up to the loss,
            {"backward_peak_bytes", last.backward_peak_bytes},  // and in the backward alone
            {"held_bytes_per_rank", every_rank(report.held_bytes, mesh)},
            {"state_bytes_per_rank", every_rank(report.state_bytes, mesh)},
            {"step_seconds", last.seconds},
            {"step_parts_seconds",  // rank 0's
             {{"vision", last.vision_s},
              {"attention", last.attention_s},
              {"communication", last.communication_s},
              {"other", last.other_s}}},
            {"sent_bytes", last.comm_bytes}}},
          {"estimate", json::object()}};
      row.update(setting_fields(setting, o));
      for (const auto& [name, bytes] : e.parts()) row["estimate"][name] = bytes;
      row["estimate"]["offloaded_to_host"] = e.offloaded;
      row["estimate"]["total"] = e.total();
      row["estimate"]["training_state"] = e.training_state();
      for (const train::MemoryEstimate::Moment& moment : e.moments())  // held + each moment
        row["estimate"]["moments"][moment.name] = e.held() + e.bytes_of(moment.parts);
      row["device"] = o.device.str();
      row["measured_over_estimate"] = e.total() > 0 ? double(last.peak_bytes) / double(e.total()) : 0.0;
      // Model FLOPs of the step: 6 · N · tokens (forward and backward of every weight) +
      // 12 · H · D · pairs per full-attention layer (QKᵀ and PV, forward and backward).
      const model::ModelConfig config = model::load_model_config(path);
      int64_t full_layers = config.text.num_hidden_layers;
      if (!config.text.layer_types.empty())
        full_layers = std::count(config.text.layer_types.begin(), config.text.layer_types.end(),
                                 model::LayerKind::full_attention);
      const double model_flops =
          6.0 * double(e.parameter_count) * double(last.tokens) +
          12.0 * double(full_layers * config.text.num_attention_heads * config.text.head_dim) * last.attention_pairs;
      row["model_flops_per_step"] = model_flops;
      row["flops_formula"] = "6 · parameters · tokens + 12 · full-attention layers · heads · head_dim · Σ n(n+1)/2";
      row["tokens_per_second"] = double(last.tokens) / last.seconds;
      row["achieved_tflops_per_rank"] = model_flops / last.seconds / 1e12 / env.world_size;
      if (o.device.is_cuda()) {
        row["peak_tflops"] = o.peak_tflops;
        row["mfu"] = model_flops / last.seconds / 1e12 / env.world_size / o.peak_tflops;
      }
      rows.push_back(row);
      if (env.rank == 0 && o.on_row) o.on_row({{"benchmark", "memory"}, {"rows", rows}});
    }
    if (path != model) std::filesystem::remove(path);
  }
  return {{"benchmark", "memory"}, {"rows", rows}};
}

}  // namespace mmsp::bench
