// Attention benchmarks; see attention_bench.h. FLOP conventions (as flash-attention
// reports them): forward 4·Tq·Tk·H·D, backward 2.5 × forward, halved when causal.
#include "attention_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <map>

#include "mmsp/attention/context_attention.h"
#include "mmsp/attention/local_attention.h"
#include "mmsp/attention/naive_attention.h"
#include "mmsp/attention/plan_layout.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/mesh.h"

namespace mmsp::bench {
namespace {

using attention::TokenLayout;
using nlohmann::json;

TokenLayout one_segment(int64_t T) { return {at::zeros({T}, at::kLong), at::arange(T, at::kLong)}; }

// Collects each benchmark's FLOP rate while the console reporter prints to stderr.
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  CollectingReporter() { SetOutputStream(&std::cerr); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) gflops[r.run_name.function_name] = r.counters.at("FLOPS").value / 1e9;
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> gflops;
};

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOPS"] = benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

json bench_attention_kernel(const AttentionBenchOptions& o) {
  at::set_num_threads(o.threads);
  const int64_t T = o.tokens, H = o.heads, Hkv = o.kv_heads, D = o.dim;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::manual_seed(0);
  const at::Tensor q = at::randn({T, H, D}, f32), k = at::randn({T, Hkv, D}, f32), v = at::randn({T, Hkv, D}, f32),
                   dout = at::randn({T, H, D}, f32);
  const TokenLayout layout = one_segment(T);
  attention::AttentionOptions ao;
  ao.block_q = o.block_q;
  ao.block_k = o.block_k;
  const double fwd_flops = 4.0 * T * T * H * D / 2;  // causal
  const double bwd_flops = 2.5 * fwd_flops;
  const int64_t N = 2048;
  const at::Tensor a = at::randn({N, N}, f32), b = at::randn({N, N}, f32);
  std::vector<benchmark::internal::Benchmark*> registered;

  registered.push_back(benchmark::RegisterBenchmark("mm_2048", [&](benchmark::State& st) {
    for (auto _ : st) benchmark::DoNotOptimize(at::mm(a, b));
    set_flops(st, 2.0 * N * N * N);
  }));
  registered.push_back(benchmark::RegisterBenchmark("mmsp_forward", [&](benchmark::State& st) {
    for (auto _ : st) benchmark::DoNotOptimize(attention::local_attention_forward(q, k, v, layout, layout, ao));
    set_flops(st, fwd_flops);
  }));
  const attention::PartialAttention fwd = attention::local_attention_forward(q, k, v, layout, layout, ao);
  registered.push_back(benchmark::RegisterBenchmark("mmsp_backward", [&](benchmark::State& st) {
    for (auto _ : st)
      benchmark::DoNotOptimize(
          attention::local_attention_backward(dout, q, k, v, fwd.out, fwd.lse, layout, layout, ao));
    set_flops(st, bwd_flops);
  }));
  // The same with the kernel's plan (block schedule, masks) made once, as a step does:
  // the difference is what planning once per step saves per call; plan_kernel what it costs.
  const attention::KernelPlanPtr plan = attention::plan_kernel(layout, layout, ao, q.device());
  registered.push_back(benchmark::RegisterBenchmark("mmsp_forward_planned", [&](benchmark::State& st) {
    for (auto _ : st) benchmark::DoNotOptimize(attention::local_attention_forward(q, k, v, *plan));
    set_flops(st, fwd_flops);
  }));
  registered.push_back(benchmark::RegisterBenchmark("mmsp_backward_planned", [&](benchmark::State& st) {
    for (auto _ : st)
      benchmark::DoNotOptimize(attention::local_attention_backward(dout, q, k, v, fwd.out, fwd.lse, *plan));
    set_flops(st, bwd_flops);
  }));
  registered.push_back(benchmark::RegisterBenchmark("plan_kernel", [&](benchmark::State& st) {
    for (auto _ : st) benchmark::DoNotOptimize(attention::plan_kernel(layout, layout, ao, q.device()));
    set_flops(st, fwd_flops);  // the rate of the forward it plans: its time = fwd_flops / rate
  }));
  registered.push_back(benchmark::RegisterBenchmark("naive_forward", [&](benchmark::State& st) {
    for (auto _ : st) benchmark::DoNotOptimize(attention::naive_attention(q, k, v, layout, layout, true));
    set_flops(st, fwd_flops);
  }));
  registered.push_back(benchmark::RegisterBenchmark("naive_backward", [&](benchmark::State& st) {
    for (auto _ : st) {
      st.PauseTiming();
      at::Tensor qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(), vg = v.clone().requires_grad_();
      at::Tensor out = attention::naive_attention(qg, kg, vg, layout, layout, true).out;
      st.ResumeTiming();
      out.backward(dout);
    }
    set_flops(st, bwd_flops);
  }));

  // One thread: the main thread's CPU time is the honest clock on a shared machine;
  // with more ATen threads only wall time counts them all.
  for (auto* b : registered) {
    b->MinTime(o.min_time);
    if (o.threads > 1) b->UseRealTime();
  }
  CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::ClearRegisteredBenchmarks();
  auto& g = reporter.gflops;
  return {{"threads", o.threads},
          {"shape",
           {{"tokens", T},
            {"heads", H},
            {"kv_heads", Hkv},
            {"dim", D},
            {"causal", true},
            {"dtype", "float32"},
            {"block_q", o.block_q},
            {"block_k", o.block_k}}},
          {"gflops", g},
          {"forward_vs_mm", g["mmsp_forward"] / g["mm_2048"]},
          {"backward_vs_mm", g["mmsp_backward"] / g["mm_2048"]},
          {"forward_vs_naive", g["mmsp_forward"] / g["naive_forward"]},
          {"backward_vs_naive", g["mmsp_backward"] / g["naive_backward"]},
          {"forward_planned_vs_unplanned", g["mmsp_forward_planned"] / g["mmsp_forward"]},
          {"backward_planned_vs_unplanned", g["mmsp_backward_planned"] / g["mmsp_backward"]},
          {"plan_seconds", fwd_flops / (g["plan_kernel"] * 1e9)}};
}

json bench_attention_balance(const AttentionBenchOptions& o) {
  // Causal work (allowed query-key pairs) of each ring rank's share, as the
  // planner shards the row: one long segment, and a packed row of uneven ones.
  json rows = json::array();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> batches = {
      {"one segment of 65536", {65536}}, {"packed 9000+3000+17000+1000+5000", {9000, 3000, 17000, 1000, 5000}}};
  for (const auto& [name, lengths] : batches)
    for (int R : {2, 4, 8})
      for (plan::Layout layout : {plan::Layout::zigzag, plan::Layout::contiguous}) {
        std::vector<int64_t> ids(lengths.size());
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
        const plan::PackedRow row = plan::pack_row(ids, lengths, R);
        const plan::ShardMap shards(row, R, 1, layout);
        const TokenLayout all = attention::row_layout(row);
        std::vector<int64_t> work;
        double max = 0, sum = 0;
        for (const TokenLayout& share : attention::ring_shares(shards)) {
          work.push_back(attention::allowed_pairs(share, all, /*causal=*/true));
          max = std::max<double>(max, work.back());
          sum += work.back();
        }
        rows.push_back({{"batch", name},
                        {"ring", R},
                        {"layout", plan::to_string(layout)},
                        {"work_per_rank", work},
                        {"max_over_mean", max / (sum / R)}});
      }
  return rows;
}

json bench_attention_comm(const dist::RankEnv& env, const AttentionBenchOptions& o) {
  at::set_num_threads(1);
  const dist::Rendezvous met = dist::Mesh::rendezvous(env, std::chrono::seconds(120));
  json rows = json::array();
  const int64_t H = o.heads, Hkv = o.kv_heads, D = o.dim, T = o.comm_tokens, b = 4;
  int mesh_index = 0;
  for (const plan::Mesh& shape : plan::all_meshes(env.world_size)) {
    if (shape.dp != 1 || shape.context() == 1) continue;
    dist::MeshOptions mo;
    mo.timeout = std::chrono::seconds(300);
    dist::Mesh mesh = dist::Mesh::create(met, env, shape, mo, "bench-" + std::to_string(mesh_index++));
    const int R = shape.ring, U = shape.ulysses, S = R * U;
    MMSP_CHECK(T % (2 * S) == 0, "--comm-tokens ", T, " must divide by 2 × ring × ulysses = ", 2 * S);
    // One segment on the zigzag layout, as the planner shards it.
    const std::vector<TokenLayout> shares =
        attention::ring_shares(plan::ShardMap(plan::pack_row({0}, {T}, R), R, U, plan::Layout::zigzag));
    const int64_t Tl = T / S;
    at::manual_seed(mesh.rank());
    at::Tensor q = at::randn({Tl, H, D}).requires_grad_(), k = at::randn({Tl, Hkv, D}).requires_grad_(),
               v = at::randn({Tl, Hkv, D}).requires_grad_();
    const dist::CommSnapshot before = mesh.stats().snapshot();
    at::Tensor out = attention::context_attention(q, k, v, {mesh.ring(), mesh.ulysses()}, shares);
    out.sum().backward();
    const dist::CommSnapshot d = mesh.stats().snapshot() - before;

    const int64_t kv_heads = Hkv % U == 0 ? Hkv : U;  // repeated when fewer than U
    const int64_t a2a = U > 1 ? (U - 1) * Tl / U * (2 * H + 2 * kv_heads) * D * b : 0;
    const int64_t kv_block = 2 * (T / R) * (kv_heads / U) * D * b;  // K and V of one ring share
    const int64_t ring_fwd = (R - 1) * kv_block;
    const int64_t ring_bwd = R > 1 ? (R - 1) * kv_block + R * kv_block : 0;  // K/V again + dK/dV home
    auto measured = [&](dist::CommKind kind, dist::Pass pass) { return d.at(kind, pass).bytes; };
    json row = {
        {"scheme", attention::scheme_name({mesh.ring(), mesh.ulysses()})},
        {"ring", R},
        {"ulysses", U},
        {"tokens", T},
        {"heads", H},
        {"kv_heads", Hkv},
        {"dim", D},
        {"dtype", "float32"},
        {"forward",
         {{"all_to_all", {{"measured", measured(dist::CommKind::all_to_all, dist::Pass::forward)}, {"formula", a2a}}},
          {"ring_exchange",
           {{"measured", measured(dist::CommKind::ring_exchange, dist::Pass::forward)}, {"formula", ring_fwd}}}}},
        {"backward",
         {{"all_to_all", {{"measured", measured(dist::CommKind::all_to_all, dist::Pass::backward)}, {"formula", a2a}}},
          {"ring_exchange",
           {{"measured", measured(dist::CommKind::ring_exchange, dist::Pass::backward)}, {"formula", ring_bwd}}}}}};
    bool match = true;
    for (const char* pass : {"forward", "backward"})
      for (auto& [kind, fig] : row[pass].items()) match &= fig["measured"] == fig["formula"];
    row["match"] = match;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace mmsp::bench
