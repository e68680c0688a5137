// Zigzag vs adaptive placement, measured attention; see placement_measure.h.
#include "placement_measure.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mmsp/attention/plan_layout.h"
#include "mmsp/attention/step_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/family.h"
#include "mmsp/plan/step_plan.h"
#include "placement_bench.h"

namespace mmsp::bench {
namespace {

using nlohmann::json;

// Every rank's value, on every rank (a sum all-reduce of one slot each).
std::vector<double> from_every_rank(double mine, const dist::Mesh& mesh) {
  at::Tensor t = at::zeros({mesh.world_size()}, at::kDouble);
  t[mesh.rank()] = mine;
  dist::all_reduce_(t, *mesh.world());
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.size(0));
}

struct Measured {
  double seconds = 0;      // slowest rank, median of the repeats
  double bytes_total = 0;  // every rank's attention bytes, one run
  double bytes_rank_max = 0;
};

// `layers` attentions forward, then backward, on this rank's slots of the plan.
Measured run_attention(const plan::StepPlan& plan, const dist::Mesh& mesh, const PlacementMeasureOptions& o) {
  const plan::ShardMap& shards = plan.rows.at(0).shards;
  const attention::ContextGroups groups{mesh.ring(), mesh.ulysses()};
  attention::AttentionOptions options;
  options.block_q = options.block_k = 256;
  const auto step = attention::plan_step_attention(groups, attention::ring_shares(shards), options, at::kCPU,
                                                   std::nullopt, attention::split_slots(shards));
  const attention::AttentionFunction attend = attention::attention_function(step);
  const int64_t L = plan.mine.local_length, H = o.shape.heads, Hkv = o.shape.kv_heads, D = o.shape.head_dim;
  at::manual_seed(mesh.rank());
  std::vector<at::Tensor> q, k, v;
  for (int64_t l = 0; l < o.shape.layers; ++l) {
    q.push_back(at::randn({L, H, D}).requires_grad_());
    k.push_back(at::randn({L, Hkv, D}).requires_grad_());
    v.push_back(at::randn({L, Hkv, D}).requires_grad_());
  }
  std::vector<double> runs;
  Measured m;
  for (int rep = 0; rep < std::max(1, o.repeats); ++rep) {
    from_every_rank(0, mesh);  // start together
    const dist::CommSnapshot ring0 = mesh.ring()->stats().snapshot(), ulysses0 = mesh.ulysses()->stats().snapshot();
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor loss = at::zeros({});
    for (int64_t l = 0; l < o.shape.layers; ++l) loss = loss + attend(q[l], k[l], v[l]).sum();
    loss.backward();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double bytes = static_cast<double>((mesh.ring()->stats().snapshot() - ring0).total_bytes() +
                                             (mesh.ulysses()->stats().snapshot() - ulysses0).total_bytes());
    const std::vector<double> times = from_every_rank(seconds, mesh), sent = from_every_rank(bytes, mesh);
    runs.push_back(*std::max_element(times.begin(), times.end()));
    m.bytes_total = 0;
    for (double b : sent) m.bytes_total += b;
    m.bytes_rank_max = *std::max_element(sent.begin(), sent.end());
  }
  std::sort(runs.begin(), runs.end());
  m.seconds = runs[runs.size() / 2];
  return m;
}

}  // namespace

json measure_placement(const dist::RankEnv& env, const PlacementMeasureOptions& o) {
  MMSP_CHECK(o.shape.element_bytes == 4, "--measure runs in float32: --element-bytes must be 4, got ",
             o.shape.element_bytes);
  at::set_num_threads(o.threads);
  const plan::Mesh shape = placement_mesh(env.world_size);
  MMSP_CHECK(shape.world() == env.world_size, "--measure needs a world of 1, 2, 4, 8, 16, 32 or 64 ranks, got ",
             env.world_size);
  dist::MeshOptions mo;
  mo.timeout = std::chrono::seconds(300);
  dist::Mesh mesh =
      dist::Mesh::create(dist::Mesh::rendezvous(env, std::chrono::seconds(120)), env, shape, mo, "bench-placement");
  const plan::ModelConventions conventions = model::conventions_from_config(nlohmann::json{{"model_type", "qwen2_vl"}});
  json rows = json::array();
  for (PlacementWorkload& w : placement_workloads(o.tokens_per_rank * env.world_size, conventions)) {
    json row = {{"workload", w.name}, {"ranks", env.world_size}, {"ring", shape.ring}, {"ulysses", shape.ulysses}};
    for (plan::Placement p : {plan::Placement::zigzag, plan::Placement::adaptive}) {
      plan::PlanOptions po;
      po.mesh = shape;
      po.placement = p;
      po.attention_shape = o.shape;
      const plan::StepPlan plan = plan::make_step_plan(w.batch, conventions, po, mesh.rank());
      const Measured m = run_attention(plan, mesh, o);
      const plan::LoadReport& load = plan.rows[0].load;
      row[plan::to_string(p)] = {{"seconds", m.seconds},
                                 {"attention_bytes", m.bytes_total},
                                 {"attention_bytes_rank_max", m.bytes_rank_max},
                                 {"planned_bytes", load.attention_bytes_total()},
                                 {"padding", load.padding_total()},
                                 {"local_length", plan.mine.local_length},
                                 {"whole_segments", load.whole_segments}};
    }
    const json &z = row["zigzag"], &a = row["adaptive"];
    row["bytes_adaptive_over_zigzag"] = z["attention_bytes"].get<double>() > 0
                                            ? a["attention_bytes"].get<double>() / z["attention_bytes"].get<double>()
                                            : 1.0;
    row["time_adaptive_over_zigzag"] = a["seconds"].get<double>() / z["seconds"].get<double>();
    row["bytes_match_plan"] = z["attention_bytes"] == z["planned_bytes"] && a["attention_bytes"] == a["planned_bytes"];
    rows.push_back(row);
  }
  const plan::AttentionShape& s = o.shape;
  return {{"measured", true},
          {"tokens_per_rank", o.tokens_per_rank},
          {"threads_per_rank", o.threads},
          {"attention_shape",
           {{"heads", s.heads},
            {"kv_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"element_bytes", s.element_bytes},
            {"layers", s.layers}}},
          {"rows", rows}};
}

}  // namespace mmsp::bench
