// The local attention every distributed scheme is built from: segment- and order-masked,
// GQA, causal or bidirectional, run by a kernel of the registry (kernel_registry.h: the
// blockwise kernel, the fused one, ...). Returns the output and the log-sum-exp so partial
// results over different key sets merge exactly (merge_partial); the backward takes the
// final output and lse.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

#include "mmsp/attention/kernel_registry.h"
#include "mmsp/attention/token_layout.h"

namespace mmsp::attention {

struct AttentionOptions {
  bool causal = true;      // false: bidirectional within a segment (vision encoders)
  double scale = 0;        // softmax scale; 0 means 1/sqrt(D)
  int64_t block_q = 512;   // query tokens per block
  int64_t block_k = 512;   // key tokens per block
  AttentionKernel kernel;  // automatic, or a registry entry (kernel_registry.h)
  // The ring's exchanges hidden behind the block in hand: the next K/V posted before the
  // block computes, and the dK/dV sent home waited for only after the next block's
  // backward. Off: each exchange posted after the compute and waited for at once (for
  // measuring the hidden communication; the sums and their order are the same, so the
  // results are bitwise equal).
  bool overlap = true;
};

// q [Tq, H, D], k/v [Tk, H_kv, D] with H a multiple of H_kv; fp64, fp32 or bf16/fp16.
// out [Tq, H, D] in q's dtype; lse [Tq, H] in the accumulation dtype (fp64 for
// fp64, else fp32); a query with no allowed key gets out 0 and lse -inf.
struct PartialAttention {
  at::Tensor out;
  at::Tensor lse;
};

PartialAttention local_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const TokenLayout& q_layout, const TokenLayout& k_layout,
                                         const AttentionOptions& options);

// The kernels that may run one pair of layouts, each with its plan: the pinned kernel
// alone, or (auto) every registry entry automatic on the device whose plan succeeded, in
// the registry's order, the blockwise kernel last. A pure function of the layouts and the
// options, so a step plans it once and every layer, forward and backward, reuses it
// (step_attention.h); the layout-taking forms below plan it on every call. Which one runs
// is decided per call by the tensors (kernel_in_use).
struct PlannedKernel {
  const LocalKernel* kernel = nullptr;
  std::shared_ptr<const KernelPart> part;
};
struct KernelPlan : torch::CustomClassHolder {
  int64_t queries = 0, keys = 0;  // tokens of the query and key layouts
  AttentionOptions options;
  std::vector<PlannedKernel> candidates;
};
using KernelPlanPtr = c10::intrusive_ptr<KernelPlan>;

// Checks the layouts (naming the bad value) and plans; masks are made on `device`.
KernelPlanPtr plan_kernel(const TokenLayout& q_layout, const TokenLayout& k_layout, const AttentionOptions& options,
                          const at::Device& device);

PartialAttention local_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const KernelPlan& plan);

// Gradients of the keys [k, v] against queries q, given dout and the FINAL out and
// lse of those queries (over all key sets they attend to, as after a ring). Returned
// in the accumulation dtype, so ring steps can add them without rounding.
struct AttentionGrads {
  at::Tensor dq, dk, dv;
};

AttentionGrads local_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                        const TokenLayout& q_layout, const TokenLayout& k_layout,
                                        const AttentionOptions& options);
AttentionGrads local_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                        const KernelPlan& plan);

// The kernel that runs for these tensors, by its implementation's name ("flash-varlen",
// "cpu-flash", "blockwise"): the first candidate that serves them. With a pinned kernel
// that does not serve them, an error naming why.
const char* kernel_in_use(const KernelPlan& plan, const at::Tensor& q);

// Differentiable form (autograd Function over the two above); its backward reuses the plan.
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const TokenLayout& q_layout,
                           const TokenLayout& k_layout, const AttentionOptions& options = {});
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KernelPlanPtr& plan);

// Merges `part` into `acc` (both over disjoint key sets of the same queries):
// lse = log(e^lse_a + e^lse_b); out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
// Rows where both are empty (-inf) stay out 0, lse -inf. acc.out is in the
// accumulation dtype.
void merge_partial(PartialAttention& acc, const PartialAttention& part);

// Checks shapes/dtypes/GQA and names the bad value; used before any collective.
void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* what);

// The accumulation dtype for inputs of `type`.
at::ScalarType accumulation_type(at::ScalarType type);

}  // namespace mmsp::attention
