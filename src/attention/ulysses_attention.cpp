// Ulysses attention; see ulysses_attention.h.
#include "mmsp/attention/ulysses_attention.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_to_all.h"
#include "mmsp/dist/all_to_all_v.h"

namespace mmsp::attention {

void check_ulysses_heads(int64_t heads, int64_t kv_heads, int ulysses) {
  MMSP_CHECK(heads % ulysses == 0, "ulysses degree ", ulysses, " must divide the query heads (", heads,
             "); use a degree that divides ", heads, " and put the rest in --ring");
  MMSP_CHECK(kv_heads % ulysses == 0 || ulysses % kv_heads == 0, "ulysses degree ", ulysses, " and key/value heads (",
             kv_heads, ") must divide one another (K/V heads are repeated when fewer than the degree)");
}

namespace {

// K/V heads fewer than U are repeated so that rank u gets head u·H_kv/U.
at::Tensor heads_for_ulysses(const at::Tensor& x, int U) {
  return x.size(1) % U == 0 ? x : x.repeat_interleave(U / x.size(1), 1);
}

}  // namespace

// What arrives is every rank's tokens in rank order, for my heads.
at::Tensor ulysses_scatter_heads(const at::Tensor& x, const std::vector<int64_t>& tokens, const dist::GroupPtr& g) {
  const int U = g->size();
  const int64_t a = x.size(0), heads = x.size(1) / U, F = x.size(2);
  at::Tensor by_rank = x.reshape({a, U, heads, F}).transpose(0, 1).reshape({U * a, heads, F});
  return dist::all_to_all_v(by_rank, std::vector<int64_t>(U, a), tokens, g);
}

at::Tensor ulysses_gather_heads(const at::Tensor& y, const std::vector<int64_t>& tokens, const dist::GroupPtr& g) {
  const int U = g->size();
  const int64_t a = tokens[g->rank()], heads = y.size(1), F = y.size(2);
  at::Tensor by_rank = dist::all_to_all_v(y, tokens, std::vector<int64_t>(U, a), g);  // [U·a, H/U, F]
  return by_rank.reshape({U, a, heads, F}).transpose(0, 1).reshape({a, U * heads, F});
}

at::Tensor ulysses_attention_v(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const dist::GroupPtr& ulysses, const std::vector<int64_t>& tokens,
                               const InnerAttention& inner) {
  const int U = ulysses->size();
  check_ulysses_heads(q.size(1), k.size(1), U);
  MMSP_CHECK(static_cast<int>(tokens.size()) == U && tokens[ulysses->rank()] == q.size(0),
             "ulysses_attention_v: ", tokens.size(), " token counts for a group of ", U, " ranks, this rank's (",
             ulysses->rank(), ") must be its ", q.size(0), " tokens");
  if (U == 1) return inner(q, k, v);
  at::Tensor qg = ulysses_scatter_heads(q, tokens, ulysses);
  at::Tensor kg = ulysses_scatter_heads(heads_for_ulysses(k, U), tokens, ulysses);
  at::Tensor vg = ulysses_scatter_heads(heads_for_ulysses(v, U), tokens, ulysses);
  return ulysses_gather_heads(inner(qg, kg, vg), tokens, ulysses);
}

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const dist::GroupPtr& ulysses, const InnerAttention& inner) {
  const int U = ulysses->size();
  check_ulysses_heads(q.size(1), k.size(1), U);
  if (U == 1) return inner(q, k, v);
  at::Tensor kr = heads_for_ulysses(k, U), vr = heads_for_ulysses(v, U);
  // [T_u, H, D] -> [T_u·U, H/U, D]: scatter heads, gather tokens
  at::Tensor qg = dist::all_to_all(q, 1, 0, ulysses);
  at::Tensor kg = dist::all_to_all(kr, 1, 0, ulysses);
  at::Tensor vg = dist::all_to_all(vr, 1, 0, ulysses);
  at::Tensor out = inner(qg, kg, vg);
  // [T_u·U, H/U, D] -> [T_u, H, D]
  return dist::all_to_all(out, 0, 1, ulysses);
}

}  // namespace mmsp::attention
