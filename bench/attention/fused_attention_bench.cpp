// The fused attention benchmark; see fused_attention_bench.h. Time is host wall time
// around each call with the device synchronised, median of the repeats. FLOPs count the
// useful work: causal forward 2·2·H·D·(allowed pairs), backward 2.5× forward (the
// FlashAttention papers' convention), so TFLOP/s compare across kernels of one shape.
#include "fused_attention_bench.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "mmsp/attention/local_attention.h"
#include "mmsp/attention/plan_layout.h"
#include "mmsp/attention/step_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/core/phase_timer.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/plan/packing.h"
#include "mmsp/plan/shard_map.h"

namespace mmsp::bench {
namespace {

at::ScalarType dtype_of(const std::string& name) { return bench_dtype(name); }

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::kCUDA)->synchronizeDevice(device.index());
}

double median_seconds(const std::function<void()>& run, const c10::Device& device, int repeats) {
  for (int i = 0; i < 2; ++i) run();
  synchronize(device);
  std::vector<double> s;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    synchronize(device);
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

attention::TokenLayout layout_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> seg, ord;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int64_t i = 0; i < lengths[s]; ++i) seg.push_back(static_cast<int64_t>(s)), ord.push_back(i);
  return {at::tensor(seg, at::kLong), at::tensor(ord, at::kLong)};
}

double causal_pairs(const std::vector<int64_t>& lengths) {
  double pairs = 0;
  for (int64_t n : lengths) pairs += 0.5 * double(n) * double(n + 1);
  return pairs;
}

// Forward + backward FLOPs of causal attention over `pairs` allowed (query, key) pairs.
double flops(double pairs, int64_t heads, int64_t dim) { return 3.5 * 4.0 * pairs * double(heads * dim); }

struct Inputs {
  at::Tensor q, k, v, dout;  // [T, H, D] / [T, Hkv, D]
};

Inputs make_inputs(int64_t T, const FusedAttentionBenchOptions& o, at::ScalarType type) {
  const auto opts = at::TensorOptions().dtype(type).device(o.device);
  return {at::randn({T, o.heads, o.dim}, opts).requires_grad_(),
          at::randn({T, o.kv_heads, o.dim}, opts).requires_grad_(),
          at::randn({T, o.kv_heads, o.dim}, opts).requires_grad_(), at::randn({T, o.heads, o.dim}, opts)};
}

// mmsp's local attention, forward + backward, on the layout of `lengths`; `kernel`: a
// registry entry's name or auto (default: --attention-kernel).
nlohmann::json time_mmsp(const std::vector<int64_t>& lengths, const FusedAttentionBenchOptions& o, at::ScalarType type,
                         const std::string& kernel = "") {
  int64_t T = 0;
  for (int64_t n : lengths) T += n;
  Inputs in = make_inputs(T, o, type);
  attention::AttentionOptions options;
  options.kernel = attention::parse_attention_kernel(kernel.empty() ? o.kernel : kernel);
  const attention::TokenLayout layout = layout_of(lengths);
  const attention::KernelPlanPtr plan = attention::plan_kernel(layout, layout, options, o.device);
  const double s = median_seconds(
      [&] {
        at::Tensor out = attention::local_attention(in.q, in.k, in.v, plan);
        out.backward(in.dout);
      },
      o.device, o.repeats);
  const double pairs = causal_pairs(lengths);
  return {{"kernel", attention::kernel_in_use(*plan, in.q)},
          {"seconds", s},
          {"tflops", flops(pairs, o.heads, o.dim) / s / 1e12}};
}

// Every registry kernel but the blockwise one (cudnn, fused, ...) on the same layout: its
// row, or why it does not serve these tensors or failed.
nlohmann::json time_each_kernel(const std::vector<int64_t>& lengths, const FusedAttentionBenchOptions& o,
                                at::ScalarType type) {
  nlohmann::json rows = nlohmann::json::object();
  const at::Tensor probe = at::empty({1, o.heads, o.dim}, at::TensorOptions().dtype(type).device(o.device));
  for (const attention::LocalKernel* k : attention::local_kernels()) {
    if (std::string(k->name()) == "blockwise") continue;
    std::string why_not;
    if (!k->serves(probe, &why_not)) {
      rows[k->name()] = {{"skipped", why_not}};
      continue;
    }
    try {
      rows[k->name()] = time_mmsp(lengths, o, type, k->name());
    } catch (const std::exception& e) { rows[k->name()] = {{"error", std::string(e.what()).substr(0, 300)}}; }
  }
  return rows;
}

// The fastest of the kernel rows, over `best` seconds (a ratio ≥ 1: faster than it).
void add_kernel_ratios(nlohmann::json& row, double best) {
  double fastest = 0;
  for (auto& [name, k] : row["kernels"].items())
    if (k.contains("seconds")) {
      k["over_best_sdpa"] = best / k["seconds"].get<double>();
      if (fastest == 0 || k["seconds"].get<double>() < fastest)
        fastest = k["seconds"].get<double>(), row["fastest_kernel"] = name;
    }
  if (fastest > 0) row["fastest_kernel_over_best_sdpa"] = best / fastest;
}

// torch's SDPA on [B, H, L, D] with one backend enabled at a time.
struct Backend {
  const char* name;
  bool flash, efficient, cudnn, math;
};

nlohmann::json time_sdpa(int64_t batch, int64_t L, double pairs, const FusedAttentionBenchOptions& o,
                         at::ScalarType type) {
  const std::vector<Backend> backends = o.device.is_cuda()
                                            ? std::vector<Backend>{{"cudnn", false, false, true, false},
                                                                   {"flash", true, false, false, false},
                                                                   {"efficient", false, true, false, false}}
                                            : std::vector<Backend>{{"cpu-flash", true, false, false, false}};
  at::Context& ctx = at::globalContext();
  const bool was[] = {ctx.userEnabledFlashSDP(), ctx.userEnabledMemEfficientSDP(), ctx.userEnabledCuDNNSDP(),
                      ctx.userEnabledMathSDP()};
  const auto opts = at::TensorOptions().dtype(type).device(o.device);
  at::Tensor q = at::randn({batch, o.heads, L, o.dim}, opts).requires_grad_();
  at::Tensor k = at::randn({batch, o.kv_heads, L, o.dim}, opts).requires_grad_();
  at::Tensor v = at::randn({batch, o.kv_heads, L, o.dim}, opts).requires_grad_();
  at::Tensor dout = at::randn({batch, o.heads, L, o.dim}, opts);
  nlohmann::json rows = nlohmann::json::array();
  for (const Backend& b : backends) {
    ctx.setSDPUseFlash(b.flash);
    ctx.setSDPUseMemEfficient(b.efficient);
    ctx.setSDPUseCuDNN(b.cudnn);
    ctx.setSDPUseMath(b.math);
    nlohmann::json row{{"backend", b.name}};
    try {
      const double s = median_seconds(
          [&] {
            at::Tensor out = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true,
                                                              std::nullopt, /*enable_gqa=*/o.kv_heads != o.heads);
            out.backward(dout);
          },
          o.device, o.repeats);
      row["seconds"] = s;
      row["tflops"] = flops(pairs, o.heads, o.dim) / s / 1e12;
    } catch (const std::exception& e) { row["error"] = std::string(e.what()).substr(0, 200); }
    rows.push_back(row);
  }
  ctx.setSDPUseFlash(was[0]);
  ctx.setSDPUseMemEfficient(was[1]);
  ctx.setSDPUseCuDNN(was[2]);
  ctx.setSDPUseMath(was[3]);
  return rows;
}

double best_seconds(const nlohmann::json& rows, std::string* which) {
  double best = 0;
  for (const auto& r : rows)
    if (r.contains("seconds") && (best == 0 || r["seconds"].get<double>() < best)) {
      best = r["seconds"].get<double>();
      *which = r["backend"].get<std::string>();
    }
  return best;
}

}  // namespace

nlohmann::json bench_fused_attention(const FusedAttentionBenchOptions& o) {
  MMSP_CHECK(!o.tokens.empty() && o.heads > 0 && o.kv_heads > 0 && o.heads % o.kv_heads == 0 && o.dim > 0,
             "bench attention --part fused: --tokens must be given, --heads a multiple of --kv-heads");
  MMSP_CHECK(o.repeats > 0, "--repeats ", o.repeats, " must be positive");
  const at::ScalarType type = dtype_of(o.dtype);
  nlohmann::json result{{"device", o.device.str()},
                        {"dtype", o.dtype},
                        {"heads", o.heads},
                        {"kv_heads", o.kv_heads},
                        {"dim", o.dim},
                        {"kernel_flag", o.kernel},
                        {"flops", "causal forward + backward: 3.5 · 4 · H · D · allowed pairs"}};
  nlohmann::json whole = nlohmann::json::array();
  for (int64_t T : o.tokens) {
    MMSP_CHECK(T > 0, "--tokens ", T, " must be positive");
    nlohmann::json row{{"tokens", T}};
    row["mmsp"] = time_mmsp({T}, o, type);
    row["kernels"] = time_each_kernel({T}, o, type);
    row["sdpa"] = time_sdpa(1, T, causal_pairs({T}), o, type);
    std::string which;
    const double best = best_seconds(row["sdpa"], &which);
    if (best > 0) {
      row["best_sdpa"] = which;
      row["mmsp_tflops_over_best_sdpa"] = best / row["mmsp"]["seconds"].get<double>();
      add_kernel_ratios(row, best);
    }
    whole.push_back(row);
  }
  result["whole"] = whole;

  // Packed segments filling the longest row, against the padded batch [segments, longest].
  const int64_t T = *std::max_element(o.tokens.begin(), o.tokens.end());
  std::vector<int64_t> lengths;
  int64_t used = 0;
  for (size_t i = 0; used < T && !o.segments.empty(); ++i) {
    const int64_t n = std::min(o.segments[i % o.segments.size()], T - used);
    MMSP_CHECK(n > 0, "--segments must be positive lengths");
    lengths.push_back(n);
    used += n;
  }
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  nlohmann::json packed{{"tokens", T}, {"segments", lengths.size()}, {"longest", longest}};
  packed["mmsp"] = time_mmsp(lengths, o, type);
  packed["sdpa_padded"] = time_sdpa(static_cast<int64_t>(lengths.size()), longest, causal_pairs(lengths), o, type);
  std::string which;
  const double best = best_seconds(packed["sdpa_padded"], &which);
  if (best > 0) {
    packed["best_sdpa_padded"] = which;
    packed["mmsp_seconds_over_padded"] = packed["mmsp"]["seconds"].get<double>() / best;
  }
  result["packed"] = packed;
  return result;
}

namespace {

// The slowest rank's value of `mine` (a sum of one-hot rows), and every rank's.
std::vector<double> per_rank(double mine, const dist::Mesh& mesh) {
  at::Tensor rows = at::zeros({mesh.world_size()}, at::kDouble);
  rows[mesh.rank()] = mine;
  dist::all_reduce_(rows, *mesh.world());
  return std::vector<double>(rows.data_ptr<double>(), rows.data_ptr<double>() + rows.numel());
}

// One ring forward + backward with overlap on or off: the median seconds and the exposed
// communication (time waiting in the exchanges, the phase timer's) per call, every rank's.
nlohmann::json time_ring(const dist::Mesh& mesh, const std::vector<attention::TokenLayout>& shares, bool overlap,
                         const FusedAttentionBenchOptions& o, const Inputs& in, std::string* kernel) {
  attention::AttentionOptions options;
  options.kernel = attention::parse_attention_kernel(o.kernel);
  options.overlap = overlap;
  const auto step = attention::plan_step_attention({mesh.ring(), mesh.ulysses()}, shares, options, o.device);
  const attention::AttentionFunction attend = attention::attention_function(step);
  const auto run = [&] {
    at::Tensor out = attend(in.q, in.k, in.v);
    out.backward(in.dout);
  };
  PhaseTimer phases;
  const ActivePhaseTimer timing(phases);
  const double seconds = median_seconds(run, o.device, o.repeats);  // warms up twice, then the repeats
  phases.reset();
  for (int i = 0; i < o.repeats; ++i) run();
  synchronize(o.device);
  const PhaseTimes t = phases.times();
  *kernel = attention::kernel_in_use(*step->kernels->from[0], in.q);
  const std::vector<double> s = per_rank(seconds, mesh), c = per_rank(t.communication_s / o.repeats, mesh),
                            a = per_rank(t.attention_s / o.repeats, mesh);
  return {{"seconds", *std::max_element(s.begin(), s.end())},
          {"seconds_per_rank", s},
          {"exposed_communication_seconds_per_rank", c},
          {"attention_kernel_seconds_per_rank", a},
          {"exposed_communication_seconds", *std::max_element(c.begin(), c.end())}};
}

}  // namespace

nlohmann::json bench_ring_attention(const dist::RankEnv& env, const FusedAttentionBenchOptions& o,
                                    dist::GpuCollectives collectives) {
  MMSP_CHECK(env.world_size > 1, "bench attention --part ring needs several ranks: mmsp-run -n 2 -- mmsp bench ...");
  const at::ScalarType type = dtype_of(o.dtype);
  const int R = env.world_size;
  const int64_t T = *std::max_element(o.tokens.begin(), o.tokens.end());
  MMSP_CHECK(T % (2 * R) == 0, "--fused-tokens ", T, " must divide into 2 × ", R, " zigzag chunks");
  const dist::Rendezvous met = dist::Mesh::rendezvous(env, std::chrono::seconds(120));
  dist::MeshOptions mesh_options;
  mesh_options.timeout = std::chrono::seconds(300);
  mesh_options.gpu_collectives = collectives;
  const dist::Mesh mesh = dist::Mesh::create(met, env, plan::Mesh{1, R, 1}, mesh_options, "ring-bench");
  const plan::PackedRow row = plan::pack_row({0}, {T}, R);
  const std::vector<attention::TokenLayout> shares =
      attention::ring_shares(plan::ShardMap(row, R, 1, plan::Layout::zigzag));
  const Inputs in = make_inputs(T / R, o, type);
  std::string kernel;
  // Off first, then on: the machine's state (caches, clocks) favours neither.
  const nlohmann::json off = time_ring(mesh, shares, false, o, in, &kernel);
  const nlohmann::json on = time_ring(mesh, shares, true, o, in, &kernel);
  nlohmann::json result{{"device", o.device.str()},
                        {"dtype", o.dtype},
                        {"ranks", R},
                        {"tokens", T},
                        {"heads", o.heads},
                        {"kv_heads", o.kv_heads},
                        {"dim", o.dim},
                        {"ring_kernel", kernel},
                        {"collectives", collectives == dist::GpuCollectives::nccl          ? "nccl"
                                        : collectives == dist::GpuCollectives::host_staged ? "host-staged gloo"
                                                                                           : "gloo"},
                        {"overlap_on", on},
                        {"overlap_off", off}};
  const double exposed_off = off["exposed_communication_seconds"].get<double>();
  const double hidden = exposed_off - on["exposed_communication_seconds"].get<double>();
  result["hidden_communication_seconds"] = hidden;
  result["hidden_communication_fraction"] = exposed_off > 0 ? hidden / exposed_off : 0.0;
  result["overlap_speedup"] = off["seconds"].get<double>() / on["seconds"].get<double>();
  if (env.rank == 0) {
    const nlohmann::json whole = time_mmsp({T}, o, type);
    const double ideal = whole["seconds"].get<double>() / R;  // one rank's kernel on the whole, split R ways
    result["whole_local"] = whole;
    result["ring_seconds_over_whole_local"] = on["seconds"].get<double>() / whole["seconds"].get<double>();
    result["ideal_seconds"] = ideal;
    result["ring_fraction_of_ideal"] = ideal / on["seconds"].get<double>();
    result["ring_fraction_of_ideal_without_overlap"] = ideal / off["seconds"].get<double>();
  }
  return result;
}

at::ScalarType bench_dtype(const std::string& name) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  MMSP_FAIL("--dtype '", name, "' must be bfloat16, float16, float32 or float64");
}

}  // namespace mmsp::bench
