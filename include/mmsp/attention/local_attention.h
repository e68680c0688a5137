// The local attention kernel every distributed scheme is built from: blockwise,
// segment- and order-masked, GQA, causal or bidirectional. Never materialises the
// full score matrix; returns the output and the log-sum-exp so partial results
// over different key sets merge exactly (merge_partial). Backward recomputes the
// scores from the saved log-sum-exp (flash-attention style). LibTorch tensor ops
// only, so it runs on the tensors' device.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/attention/token_layout.h"

namespace mmsp::attention {

struct AttentionOptions {
  bool causal = true;     // false: bidirectional within a segment (vision encoders)
  double scale = 0;       // softmax scale; 0 means 1/sqrt(D)
  int64_t block_q = 512;  // query tokens per block
  int64_t block_k = 512;  // key tokens per block
};

// q [Tq, H, D], k/v [Tk, H_kv, D] with H a multiple of H_kv; fp64, fp32 or bf16/fp16.
// out [Tq, H, D] in q's dtype; lse [Tq, H] in the accumulation dtype (fp64 for
// fp64, else fp32); a query with no allowed key gets out 0 and lse -inf.
struct PartialAttention {
  at::Tensor out;
  at::Tensor lse;
};

PartialAttention local_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const TokenLayout& q_layout,
                                         const TokenLayout& k_layout,
                                         const AttentionOptions& options);

// Gradients of the keys [k, v] against queries q, given dout and the FINAL out and
// lse of those queries (over all key sets they attend to, as after a ring). Returned
// in the accumulation dtype, so ring steps can add them without rounding.
struct AttentionGrads {
  at::Tensor dq, dk, dv;
};

AttentionGrads local_attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& out, const at::Tensor& lse,
                                        const TokenLayout& q_layout, const TokenLayout& k_layout,
                                        const AttentionOptions& options);

// Differentiable form (autograd Function over the two above).
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const TokenLayout& q_layout, const TokenLayout& k_layout,
                           const AttentionOptions& options = {});

// Merges `part` into `acc` (both over disjoint key sets of the same queries):
// lse = log(e^lse_a + e^lse_b); out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
// Rows where both are empty (-inf) stay out 0, lse -inf. acc.out is in the
// accumulation dtype.
void merge_partial(PartialAttention& acc, const PartialAttention& part);

// Checks shapes/dtypes/GQA and names the bad value; used before any collective.
void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const char* what);

// The accumulation dtype for inputs of `type`.
at::ScalarType accumulation_type(at::ScalarType type);

}  // namespace mmsp::attention
