// Gated DeltaNet benchmarks; see linear_attention_bench.h. Bytes are what this rank
// (rank 0) sends, as the dist/ counters record them; formulas are in
// docs/linear_attention.md.
#include "linear_attention_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>

#include "mmsp/attention/linear/gated_delta_recurrence.h"
#include "mmsp/attention/linear/gated_delta_ring.h"
#include "mmsp/attention/linear/gated_delta_rule.h"
#include "mmsp/attention/plan_layout.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/layers/gated_deltanet_layer.h"

namespace mmsp::bench {
namespace {

using attention::TokenLayout;
using nlohmann::json;

template <typename F>
double seconds_of(F&& f, int repeats, const c10::Device& device = c10::kCPU) {
  // On CUDA the host returns at launch: wait for the device on both sides of the timing.
  auto sync = [&] {
    if (device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::kCUDA)->synchronizeDevice(device.index());
  };
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    sync();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

model::GatedDeltaNetConfig config_of(const LinearAttentionBenchOptions& o) {
  model::GatedDeltaNetConfig c;
  c.hidden_size = o.hidden;
  c.num_key_heads = o.key_heads;
  c.num_value_heads = o.value_heads;
  c.key_head_dim = o.key_dim;
  c.value_head_dim = o.value_dim;
  return c;
}

// Qwen3-Next-80B-A3B's linear-attention sizes (config.json), for the formula column.
model::GatedDeltaNetConfig qwen3_next_config() {
  model::GatedDeltaNetConfig c;
  c.hidden_size = 2048;
  c.num_key_heads = 16;
  c.num_value_heads = 32;
  c.key_head_dim = 128;
  c.value_head_dim = 128;
  return c;
}

// One segment of T tokens on the zigzag layout, as the planner shards it.
std::vector<TokenLayout> zigzag_shares(int64_t T, int R, int U) {
  return attention::ring_shares(plan::ShardMap(plan::pack_row({0}, {T}, R), R, U, plan::Layout::zigzag));
}

// Forward bytes per layer of this rank: {ulysses all-to-alls, ring all-gathers}.
std::pair<int64_t, int64_t> forward_formula(const model::GatedDeltaNetConfig& c, int64_t T, int R, int U,
                                            int64_t act_bytes, int64_t state_bytes, int64_t max_runs) {
  const int64_t a2a = model::gated_delta_ulysses_bytes(c, T / (R * U), U, act_bytes);
  const int64_t ring = attention::gated_delta_ring_conv_bytes(R, max_runs, c.conv_kernel, c.conv_dim() / U, act_bytes) +
                       attention::gated_delta_ring_state_bytes(R, max_runs, c.num_value_heads / U, c.key_head_dim,
                                                               c.value_head_dim, state_bytes);
  return {a2a, ring};
}

}  // namespace

json bench_linear_attention_kernel(const LinearAttentionBenchOptions& o) {
  at::set_num_threads(o.threads);
  at::NoGradGuard no_grad;
  json rows = json::array();
  const int64_t T = o.kernel_tokens, H = o.value_heads, K = o.key_dim, V = o.value_dim;
  TokenLayout layout{at::zeros({T}, at::kLong), at::arange(T, at::kLong)};
  const std::vector<attention::TokenRun> runs = attention::token_runs(layout);
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    at::manual_seed(0);
    auto opts = at::TensorOptions().dtype(type).device(o.device);
    auto l2 = [](const at::Tensor& x) { return x / x.pow(2).sum(-1, true).sqrt(); };
    at::Tensor q = l2(at::randn({T, H, K}, opts)), k = l2(at::randn({T, H, K}, opts));
    at::Tensor v = at::randn({T, H, V}, opts), g = -0.2 * at::rand({T, H}, opts), beta = at::rand({T, H}, opts);
    at::Tensor out;
    const double chunked =
        seconds_of([&] { out = attention::gated_delta_rule(q, k, v, g, beta, runs).out; }, 3, o.device);
    at::Tensor ref;
    const double recurrent =
        seconds_of([&] { ref = attention::gated_delta_recurrence(q, k, v, g, beta, layout); }, 1, o.device);
    const double diff = (out - ref).abs().max().item<double>() / (1 + ref.abs().max().item<double>());
    rows.push_back({{"device", o.device.str()},
                    {"dtype", type == at::kFloat ? "float32" : "float64"},
                    {"tokens", T},
                    {"heads", H},
                    {"key_dim", K},
                    {"value_dim", V},
                    {"chunk", attention::kGatedDeltaChunk},
                    {"threads", o.threads},
                    {"chunked_tokens_per_s", T / chunked},
                    {"recurrence_tokens_per_s", T / recurrent},
                    {"ratio", recurrent / chunked},
                    {"max_rel_diff", diff}});
  }
  return rows;
}

json bench_linear_attention_comm(const dist::RankEnv& env, const LinearAttentionBenchOptions& o) {
  at::set_num_threads(o.threads);
  const dist::Rendezvous met = dist::Mesh::rendezvous(env, std::chrono::seconds(300));
  const model::GatedDeltaNetConfig c = config_of(o), big = qwen3_next_config();
  json rows = json::array();
  int mesh_index = 0;
  for (const plan::Mesh& shape : plan::all_meshes(env.world_size)) {
    if (shape.dp != 1 || shape.context() == 1) continue;
    const int R = shape.ring, U = shape.ulysses, S = R * U;
    if (c.num_key_heads % U != 0 || c.num_value_heads % U != 0) continue;  // Ulysses cannot split the heads
    dist::MeshOptions mo;
    mo.timeout = std::chrono::seconds(600);
    dist::Mesh mesh = dist::Mesh::create(met, env, shape, mo, "bench-gdn-" + std::to_string(mesh_index++));
    const model::GatedDeltaNetWeights w = model::GatedDeltaNetWeights::random(c, at::kFloat, 1);
    for (int64_t T : o.tokens) {
      MMSP_CHECK(T % (2 * S) == 0, "--tokens ", T, " must divide by 2 × ring × ulysses = ", 2 * S);
      const std::vector<TokenLayout> shares = zigzag_shares(T, R, U);
      const attention::RingRuns runs = attention::RingRuns::make(shares);
      at::manual_seed(mesh.rank());
      at::Tensor x = at::randn({T / S, c.hidden_size}).requires_grad_();
      const dist::CommSnapshot before = mesh.stats().snapshot();
      const auto t0 = std::chrono::steady_clock::now();
      at::Tensor out = model::gated_deltanet_forward(w, c, x, {{mesh.ring(), mesh.ulysses()}, shares});
      out.sum().backward();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const dist::CommSnapshot d = mesh.stats().snapshot() - before;

      const auto [a2a, ring] = forward_formula(c, T, R, U, 4, 4, runs.max_runs());
      // Backward: the all-to-alls mirrored; each all-gather's backward sends every
      // other rank's rows of the gradient back: (total runs − mine) rows.
      int64_t total_runs = 0;
      for (const auto& r : runs.runs) total_runs += static_cast<int64_t>(r.size());
      const int64_t others = R > 1 ? total_runs - static_cast<int64_t>(runs.runs[mesh.ring()->rank()].size()) : 0;
      const int64_t ring_bwd =
          others * ((c.conv_kernel - 1) * (c.conv_dim() / U) * 4 +
                    (c.num_value_heads / U) * c.key_head_dim * (c.key_head_dim + c.value_head_dim) * 4);
      auto measured = [&](dist::CommKind kind, dist::Pass pass) { return d.at(kind, pass).bytes; };
      using dist::CommKind;
      using dist::Pass;
      json row = {
          {"scheme", attention::scheme_name({mesh.ring(), mesh.ulysses()})},
          {"ring", R},
          {"ulysses", U},
          {"tokens", T},
          {"runs_max", runs.max_runs()},
          {"forward",
           {{"all_to_all", {{"measured", measured(CommKind::all_to_all, Pass::forward)}, {"formula", a2a}}},
            {"all_gather_v", {{"measured", measured(CommKind::all_gather_v, Pass::forward)}, {"formula", ring}}}}},
          {"backward",
           {{"all_to_all", {{"measured", measured(CommKind::all_to_all, Pass::backward)}, {"formula", a2a}}},
            {"all_gather_v", {{"measured", measured(CommKind::all_gather_v, Pass::backward)}, {"formula", ring_bwd}}}}},
          {"seconds_fwd_bwd", secs}};
      bool match = true;
      for (const char* pass : {"forward", "backward"})
        for (auto& [kind, fig] : row[pass].items()) match &= fig["measured"] == fig["formula"];
      row["match"] = match;
      const auto [big_a2a, big_ring] = forward_formula(big, T, R, U, 2, 4, runs.max_runs());
      row["qwen3_next_forward_formula"] = {{"all_to_all_bf16", big_a2a}, {"all_gather_v_bf16_fp32_state", big_ring}};
      rows.push_back(row);
    }
  }
  return {{"sizes",
           {{"hidden", c.hidden_size},
            {"key_heads", c.num_key_heads},
            {"value_heads", c.num_value_heads},
            {"key_dim", c.key_head_dim},
            {"value_dim", c.value_head_dim},
            {"conv_kernel", c.conv_kernel},
            {"dtype", "float32"}}},
          {"qwen3_next_sizes",
           {{"key_heads", big.num_key_heads},
            {"value_heads", big.num_value_heads},
            {"key_dim", big.key_head_dim},
            {"value_dim", big.value_head_dim}}},
          {"rows", rows}};
}

}  // namespace mmsp::bench
