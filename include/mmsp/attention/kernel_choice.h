// `--attention-kernel auto` by measurement: for one key (dtype, head size, heads and K/V
// heads — the GQA ratio —, length bucket, causal), every candidate kernel of the registry
// first runs an exactness probe against the blockwise kernel on this device (output, lse
// and dq/dk/dv on packed segments and a zigzag ring step, within the dtype's stated
// tolerances), then a short timing (forward + backward, median); the fastest that passed is
// the job's. A candidate that does not plan, does not serve, errors or fails its probe is
// skipped with its reason, and the whole table is kept for the log.
//
// Every rank must run the same kernel (the ring merges what each rank's kernel computes,
// and a job's numerics should not depend on timing noise): the ranks agree before the
// choice — each candidate's seconds are the slowest rank's, and it passed only if it passed
// on every rank — so every rank takes the same argmin of the same table, with no rank's
// answer broadcast. The timing and the agreement are injectable: the CPU tests drive the
// logic with a deliberately wrong kernel and fake timings.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "mmsp/attention/kernel_registry.h"
#include "mmsp/dist/group.h"

namespace mmsp::attention {

struct ChoiceKey {
  at::ScalarType dtype = at::kBFloat16;
  int64_t head_dim = 128, heads = 16, kv_heads = 16;
  int64_t tokens = 8192;  // the length bucket: a power of two (choice_key rounds up)
  bool causal = true;
  auto tie() const { return std::tie(dtype, head_dim, heads, kv_heads, tokens, causal); }
  bool operator<(const ChoiceKey& o) const { return tie() < o.tie(); }
  std::string text() const;  // "BFloat16, 16 heads of 128, GQA 1, 8192 tokens, causal"
};
// The key of a local attention over `tokens` query tokens: the tokens rounded up to a
// power of two (at least 256), so nearby lengths share one measurement.
ChoiceKey choice_key(at::ScalarType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t tokens,
                     bool causal);

// The probe passes when max|x − reference| ≤ tolerance × (1 + max|reference|) for each.
struct ProbeTolerance {
  double out, lse, grad;
};
// bf16: 2e-2 / 1e-2 / 4e-2 (one bf16 rounding of P and the output against fp32; measured
// ~4e-3); fp16: 4e-3 / 2e-3 / 1e-2; fp32: 1e-4 / 1e-4 / 1e-3; fp64: 1e-10 / 1e-10 / 1e-9.
ProbeTolerance probe_tolerance(at::ScalarType dtype);

struct CandidateRow {
  std::string kernel;          // its registry name
  std::string implementation;  // what serves() named ("cudnn-varlen", "flash-varlen", ...), or ""
  bool passed = false;         // on every rank
  std::string reason;          // why it was skipped (empty for a passing one)
  double out_error = -1, lse_error = -1, grad_error = -1;  // this rank's probe; -1: not run
  double seconds = -1;  // the slowest rank's median forward + backward; -1: not timed
};

struct KernelChoice {
  ChoiceKey key;
  const LocalKernel* chosen = nullptr;
  std::vector<CandidateRow> table;  // in the candidates' order
  std::string table_text() const;   // one line per candidate, for the log
};

struct ChoiceInputs {
  // The kernels tried, in order (ties go to the earlier); empty: every registry entry
  // automatic on `device`, then the blockwise kernel. The blockwise kernel is the probe's
  // reference whether listed or not.
  std::vector<const LocalKernel*> candidates;
  c10::Device device{c10::kCPU};
  int64_t probe_tokens = 384;  // the probe's packed row (a zigzag step takes half of it)
  // One causal sequence of this many tokens is timed; 0: the key's bucket, at most 32,768
  // (a short timing: past it the kernels' ratios change little and the blockwise one is slow).
  int64_t timing_tokens = 0;
  int repeats = 3;  // timed runs after one warm-up; the median is kept
  // Seconds of one call of `run` (a forward + backward of `kernel`); default: the wall
  // clock around it, the device synchronised before and after.
  std::function<double(const LocalKernel& kernel, const std::function<void()>& run)> time;
  // Makes the table agree over the ranks, in place: seconds [candidates] to the maximum,
  // passed [candidates] (1/0) to the minimum; default: nothing (one rank). agree_over(group).
  std::function<void(at::Tensor& seconds, at::Tensor& passed)> agree;
};

// The agreement over every rank of `group` (two sum all-reduces of one-hot rows, Gloo).
std::function<void(at::Tensor& seconds, at::Tensor& passed)> agree_over(dist::GroupPtr group);

// Probes and times every candidate for `key`; every rank of the agreement must call it
// with the same key and candidates. Fails only if no candidate passes.
KernelChoice choose_kernel(const ChoiceKey& key, const ChoiceInputs& inputs);

// The choices of one caller (a training run), measured once per key.
class KernelChooser {
 public:
  explicit KernelChooser(ChoiceInputs inputs) : inputs_(std::move(inputs)) {}
  const KernelChoice& choose(const ChoiceKey& key);
  size_t measured() const { return cache_.size(); }

 private:
  ChoiceInputs inputs_;
  std::map<ChoiceKey, KernelChoice> cache_;
};

}  // namespace mmsp::attention
