// The Gated DeltaNet rule written plainly, one token at a time: the reference the
// chunked kernel (gated_delta_rule.h) is tested against and the baseline it is
// benchmarked against, as naive_attention.h is for the softmax kernel. Slow by design.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/attention/token_layout.h"

namespace mmsp::attention {

// q, k [T, H, K], v [T, H, V], g, beta [T, H]; the state restarts wherever a token's
// order is 0 or its segment changes; padding tokens (segment < 0) get zero output
// and leave the state alone.
//   S_t = exp(g_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t / √K
at::Tensor gated_delta_recurrence(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const at::Tensor& beta, const TokenLayout& layout);

}  // namespace mmsp::attention
