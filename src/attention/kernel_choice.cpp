// The local kernel chosen by an exactness probe and a timing; see kernel_choice.h.
#include "mmsp/attention/kernel_choice.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <sstream>

#include "kernels/kernels.h"
#include "mmsp/attention/local_attention.h"
#include "mmsp/attention/plan_layout.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/plan/packing.h"
#include "mmsp/plan/shard_map.h"

namespace mmsp::attention {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string scientific(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1e", x);
  return text;
}

// max|got − want| / (1 + max|want|) over the finite entries; infinite where the
// infinities (a query without keys: lse −inf) differ.
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kCPU, at::kDouble), w = want.to(at::kCPU, at::kDouble);
  if (g.sizes() != w.sizes()) return kInf;
  const at::Tensor finite = w.isfinite();
  if (!g.isfinite().equal(finite)) return kInf;
  if (w.numel() == 0) return 0;
  const at::Tensor wf = w.masked_fill(finite.logical_not(), 0), gf = g.masked_fill(finite.logical_not(), 0);
  return ((gf - wf).abs().max() / (1 + wf.abs().max())).item<double>();
}

struct ProbeCase {
  TokenLayout q, k;
};

// Packed segments of a row attending themselves (one of them shorter than most blocks),
// and two steps of a zigzag ring of 2 over the same row: causal pieces, full pieces, and
// queries that see no key of the step.
std::vector<ProbeCase> probe_cases(int64_t tokens) {
  const int64_t a = std::max<int64_t>(tokens / 2, 8), b = std::max<int64_t>(tokens / 4 + 3, 8);
  const plan::PackedRow row = plan::pack_row({0, 1, 2}, {a, b, 7}, 2);
  const TokenLayout whole = row_layout(row);
  const std::vector<TokenLayout> shares = ring_shares(plan::ShardMap(row, 2, 1, plan::Layout::zigzag));
  return {{whole, whole}, {shares[0], shares[0]}, {shares[1], shares[0]}};
}

struct Result {
  PartialAttention forward;
  AttentionGrads grads;
};

KernelPlanPtr plan_for(const LocalKernel& kernel, const TokenLayout& q, const TokenLayout& k, bool causal,
                       const at::Device& device, std::string* why_not) {
  AttentionOptions options;
  options.causal = causal;
  options.kernel = AttentionKernel{&kernel};
  std::shared_ptr<const KernelPart> part = kernel.plan(q, k, options, device, why_not);
  if (!part) return {};
  auto plan = c10::make_intrusive<KernelPlan>();
  plan->queries = q.size(), plan->keys = k.size(), plan->options = options;
  plan->candidates.push_back({&kernel, std::move(part)});
  return plan;
}

struct Tensors {
  at::Tensor q, k, v, dout;
};
Tensors random_tensors(const ChoiceKey& key, int64_t tq, int64_t tk, const at::Device& device, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto on = at::TensorOptions().dtype(key.dtype).device(device);
  auto draw = [&](int64_t t, int64_t h) { return at::randn({t, h, key.head_dim}, gen, at::kDouble).to(on); };
  Tensors x{draw(tq, key.heads), draw(tk, key.kv_heads), draw(tk, key.kv_heads), draw(tq, key.heads)};
  return x;
}

Result run_once(const KernelPlan& plan, const Tensors& x) {
  Result r;
  r.forward = local_attention_forward(x.q, x.k, x.v, plan);
  r.grads = local_attention_backward(x.dout, x.q, x.k, x.v, r.forward.out, r.forward.lse, plan);
  return r;
}

// The probe of one candidate against the blockwise references (one per case): fills the
// row's errors, or its reason when it fails or does not plan.
void probe(const LocalKernel& kernel, const ChoiceKey& key, const ChoiceInputs& in, const std::vector<ProbeCase>& cases,
           const std::vector<Tensors>& inputs, const std::vector<Result>& reference, CandidateRow& row) {
  row.out_error = row.lse_error = row.grad_error = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    std::string why_not;
    const KernelPlanPtr plan = plan_for(kernel, cases[c].q, cases[c].k, key.causal, in.device, &why_not);
    if (!plan) {
      row.reason = "does not plan the probe's layouts: " + why_not;
      return;
    }
    const Result r = run_once(*plan, inputs[c]);
    const Result& ref = reference[c];
    row.out_error = std::max(row.out_error, relative_error(r.forward.out, ref.forward.out));
    row.lse_error = std::max(row.lse_error, relative_error(r.forward.lse, ref.forward.lse));
    for (const auto& [got, want] : {std::pair{r.grads.dq, ref.grads.dq}, std::pair{r.grads.dk, ref.grads.dk},
                                    std::pair{r.grads.dv, ref.grads.dv}})
      row.grad_error = std::max(row.grad_error, relative_error(got, want));
  }
  const ProbeTolerance tol = probe_tolerance(key.dtype);
  for (const auto& [name, error, limit] :
       {std::tuple{"out", row.out_error, tol.out}, std::tuple{"lse", row.lse_error, tol.lse},
        std::tuple{"gradient", row.grad_error, tol.grad}})
    if (!(error <= limit)) {
      row.reason = std::string("failed the probe: ") + name + " error " + scientific(error) + " > " + scientific(limit);
      return;
    }
  row.passed = true;
}

double wall_seconds(const c10::Device& device, const std::function<void()>& run) {
  const auto sync = [&] {
    if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
  };
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  run();
  sync();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The median seconds of the kernel's forward + backward on one causal sequence.
double time_kernel(const LocalKernel& kernel, const ChoiceKey& key, const ChoiceInputs& in) {
  const int64_t T = in.timing_tokens > 0 ? in.timing_tokens : std::min<int64_t>(key.tokens, 32768);
  const plan::PackedRow row = plan::pack_row({0}, {T}, 1);
  const TokenLayout layout = row_layout(row);
  std::string why_not;
  const KernelPlanPtr plan = plan_for(kernel, layout, layout, key.causal, in.device, &why_not);
  MMSP_CHECK(plan, "kernel choice: ", kernel.name(), " planned the probe but not one sequence of ", T,
             " tokens: ", why_not);
  const Tensors x = random_tensors(key, layout.size(), layout.size(), in.device, 3);
  const std::function<void()> run = [&] { run_once(*plan, x); };
  auto time = in.time ? in.time : [&in](const LocalKernel&, const std::function<void()>& f) {
    return wall_seconds(in.device, f);
  };
  time(kernel, run);  // warm-up (a first call builds plans, caches, cuDNN graphs)
  std::vector<double> seconds;
  for (int i = 0; i < std::max(1, in.repeats); ++i) seconds.push_back(time(kernel, run));
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

std::vector<const LocalKernel*> candidates_of(const ChoiceInputs& in) {
  if (!in.candidates.empty()) return in.candidates;
  std::vector<const LocalKernel*> out;
  for (const LocalKernel* k : local_kernels())
    if (k->automatic_on(in.device) && k != &blockwise_kernel()) out.push_back(k);
  out.push_back(&blockwise_kernel());
  return out;
}

// Probes and times one candidate on this rank: its row (reason set when skipped here).
CandidateRow measure(const LocalKernel& kernel, const ChoiceKey& key, const ChoiceInputs& in,
                     const std::vector<ProbeCase>& cases, const std::vector<Tensors>& inputs,
                     const std::vector<Result>& reference) {
  CandidateRow row;
  row.kernel = kernel.name();
  std::string why_not;
  const char* serving = kernel.serves(inputs[0].q, &why_not);
  if (!serving) {
    row.reason = "does not serve " + std::string(c10::toString(key.dtype)) + " on " + in.device.str() + ": " + why_not;
    return row;
  }
  row.implementation = serving;
  try {
    probe(kernel, key, in, cases, inputs, reference, row);
    if (row.passed) row.seconds = time_kernel(kernel, key, in);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n')).substr(0, 240);
    row.passed = false;
    row.reason = "error: " + what;
  }
  return row;
}

}  // namespace

std::string ChoiceKey::text() const {
  std::ostringstream out;
  out << c10::toString(dtype) << ", " << heads << " heads of " << head_dim << ", GQA "
      << heads / std::max<int64_t>(1, kv_heads) << ", " << tokens << " tokens, "
      << (causal ? "causal" : "bidirectional");
  return out.str();
}

ChoiceKey choice_key(at::ScalarType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t tokens,
                     bool causal) {
  MMSP_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && tokens > 0, "kernel choice: heads ",
             heads, " must be a positive multiple of K/V heads ", kv_heads, ", head size ", head_dim, " and tokens ",
             tokens, " positive");
  int64_t bucket = 256;
  while (bucket < tokens) bucket *= 2;
  return {dtype, head_dim, heads, kv_heads, bucket, causal};
}

ProbeTolerance probe_tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return {2e-2, 1e-2, 4e-2};
    case at::kHalf:
      return {4e-3, 2e-3, 1e-2};
    case at::kFloat:
      return {1e-4, 1e-4, 1e-3};
    default:
      return {1e-10, 1e-10, 1e-9};
  }
}

std::function<void(at::Tensor&, at::Tensor&)> agree_over(dist::GroupPtr group) {
  return [group](at::Tensor& seconds, at::Tensor& passed) {
    const int P = group->size();
    if (P == 1) return;
    at::Tensor rows = at::zeros({2, P, seconds.size(0)}, at::kDouble);  // one-hot rows, summed
    rows[0][group->rank()].copy_(seconds);
    rows[1][group->rank()].copy_(passed);
    dist::all_reduce_(rows, *group);
    seconds = rows[0].amax(0);
    passed = rows[1].amin(0);
  };
}

KernelChoice choose_kernel(const ChoiceKey& key, const ChoiceInputs& in) {
  at::NoGradGuard no_grad;
  const std::vector<const LocalKernel*> candidates = candidates_of(in);
  const std::vector<ProbeCase> cases = probe_cases(in.probe_tokens);
  std::vector<Tensors> inputs;
  std::vector<Result> reference;
  for (size_t c = 0; c < cases.size(); ++c) {
    inputs.push_back(random_tensors(key, cases[c].q.size(), cases[c].k.size(), in.device, 11 + c));
    std::string why_not;
    const KernelPlanPtr plan = plan_for(blockwise_kernel(), cases[c].q, cases[c].k, key.causal, in.device, &why_not);
    MMSP_ASSERT(plan, "the blockwise kernel plans every layout");
    reference.push_back(run_once(*plan, inputs[c]));
  }
  KernelChoice choice;
  choice.key = key;
  const int64_t n = static_cast<int64_t>(candidates.size());
  at::Tensor seconds = at::full({n}, -1.0, at::kDouble), passed = at::zeros({n}, at::kDouble);
  for (int64_t i = 0; i < n; ++i) {
    choice.table.push_back(measure(*candidates[i], key, in, cases, inputs, reference));
    seconds[i] = choice.table.back().seconds;
    passed[i] = choice.table.back().passed ? 1.0 : 0.0;
  }
  if (in.agree) in.agree(seconds, passed);
  for (int64_t i = 0; i < n; ++i) {
    CandidateRow& row = choice.table[i];
    row.seconds = seconds[i].item<double>();
    if (row.passed && passed[i].item<double>() < 1) {
      row.passed = false;
      row.reason = "passed here, but failed or errored on another rank";
    }
  }
  double best = kInf;
  for (int64_t i = 0; i < n; ++i)
    if (choice.table[i].passed && choice.table[i].seconds < best)
      best = choice.table[i].seconds, choice.chosen = candidates[i];
  MMSP_CHECK(choice.chosen, "kernel choice for ", key.text(), ": no kernel passed its probe:\n", choice.table_text());
  return choice;
}

std::string KernelChoice::table_text() const {
  std::ostringstream out;
  for (const CandidateRow& row : table) {
    out << "  " << row.kernel;
    if (!row.implementation.empty()) out << " (" << row.implementation << ")";
    if (row.passed) {
      char text[64];
      std::snprintf(text, sizeof text, ": %.3f ms", row.seconds * 1e3);
      out << text << ", probe errors out " << scientific(row.out_error) << " lse " << scientific(row.lse_error)
          << " grad " << scientific(row.grad_error);
      if (chosen && row.kernel == chosen->name()) out << "  <- chosen";
    } else {
      out << ": skipped: " << row.reason;
    }
    out << "\n";
  }
  return out.str();
}

const KernelChoice& KernelChooser::choose(const ChoiceKey& key) {
  auto found = cache_.find(key);
  if (found == cache_.end()) found = cache_.emplace(key, choose_kernel(key, inputs_)).first;
  return found->second;
}

}  // namespace mmsp::attention
