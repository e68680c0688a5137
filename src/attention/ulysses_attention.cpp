// Ulysses attention; see ulysses_attention.h.
#include "mmsp/attention/ulysses_attention.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_to_all.h"

namespace mmsp::attention {

void check_ulysses_heads(int64_t heads, int64_t kv_heads, int ulysses) {
  MMSP_CHECK(heads % ulysses == 0, "ulysses degree ", ulysses, " must divide the query heads (",
             heads, "); use a degree that divides ", heads, " and put the rest in --ring");
  MMSP_CHECK(kv_heads % ulysses == 0 || ulysses % kv_heads == 0, "ulysses degree ", ulysses,
             " and key/value heads (", kv_heads,
             ") must divide one another (K/V heads are repeated when fewer than the degree)");
}

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const dist::GroupPtr& ulysses, const InnerAttention& inner) {
  const int U = ulysses->size();
  check_ulysses_heads(q.size(1), k.size(1), U);
  if (U == 1) return inner(q, k, v);
  at::Tensor kr = k, vr = v;
  if (k.size(1) % U != 0) {  // H_kv < U: rank u needs K/V head u·H_kv/U
    kr = k.repeat_interleave(U / k.size(1), 1);
    vr = v.repeat_interleave(U / v.size(1), 1);
  }
  // [T_u, H, D] -> [T_u·U, H/U, D]: scatter heads, gather tokens
  at::Tensor qg = dist::all_to_all(q, 1, 0, ulysses);
  at::Tensor kg = dist::all_to_all(kr, 1, 0, ulysses);
  at::Tensor vg = dist::all_to_all(vr, 1, 0, ulysses);
  at::Tensor out = inner(qg, kg, vg);
  // [T_u·U, H/U, D] -> [T_u, H, D]
  return dist::all_to_all(out, 0, 1, ulysses);
}

}  // namespace mmsp::attention
