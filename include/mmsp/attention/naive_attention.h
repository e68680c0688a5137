// The plain full-matrix masked softmax attention: the reference the blockwise
// kernel is tested against and the baseline it is benchmarked against. It builds
// the whole [H, Tq, Tk] score matrix; autograd supplies its gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/attention/token_layout.h"

namespace mmsp::attention {

// Allowed (query, key) pairs, bool [Tq, Tk].
at::Tensor attention_mask(const TokenLayout& q, const TokenLayout& k, bool causal);

// q [Tq, H, D], k/v [Tk, H_kv, D] -> out [Tq, H, D], lse [Tq, H]; GQA by repeating
// K/V heads; a query with no allowed key gets out 0, lse -inf and finite gradients.
struct NaiveAttention {
  at::Tensor out, lse;
};
NaiveAttention naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const TokenLayout& q_layout, const TokenLayout& k_layout, bool causal);

}  // namespace mmsp::attention
