// The step's attention as one forward and one backward, without autograd; see
// step_attention.h. Ulysses' exchanges are written out (their backward is the mirrored
// exchange, counted as the backward's bytes), the inner attention is the ring's or the
// local kernel's own forward and backward, so the backward never runs a forward again.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mmsp/attention/step_attention.h"
#include "mmsp/attention/ulysses_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_to_all.h"
#include "mmsp/dist/all_to_all_v.h"

namespace mmsp::attention {
namespace {

using dist::Pass;

// K/V heads fewer than U are repeated so that rank u gets head u·H_kv/U; the backward sums
// the repeats' gradients back.
at::Tensor repeated_heads(const at::Tensor& x, int U) {
  return x.size(1) % U == 0 ? x : x.repeat_interleave(U / x.size(1), 1);
}
at::Tensor folded_heads(const at::Tensor& dx, int64_t heads) {
  if (dx.size(1) == heads) return dx;
  return dx.view({dx.size(0), heads, dx.size(1) / heads, dx.size(2)}).sum(2);
}

// Ulysses' exchanges, equal tokens (dims) or a mixed placement's split slots (tokens).
struct Exchange {
  const dist::GroupPtr& group;
  const std::vector<int64_t>* tokens = nullptr;  // null: every rank the same count (all_to_all)

  at::Tensor scatter(const at::Tensor& x, Pass pass) const {  // [T_u, H, F] -> [T, H/U, F]
    if (group->size() == 1) return x;
    if (!tokens) return dist::detail::all_to_all_raw(x, 1, 0, *group, pass);
    const int U = group->size();
    const int64_t a = x.size(0), heads = x.size(1) / U, F = x.size(2);
    at::Tensor by_rank = x.reshape({a, U, heads, F}).transpose(0, 1).reshape({U * a, heads, F});
    return dist::detail::all_to_all_v_raw(by_rank, std::vector<int64_t>(U, a), *tokens, *group, pass);
  }
  at::Tensor gather(const at::Tensor& y, Pass pass) const {  // [T, H/U, F] -> [T_u, H, F]
    if (group->size() == 1) return y;
    if (!tokens) return dist::detail::all_to_all_raw(y, 0, 1, *group, pass);
    const int U = group->size();
    const int64_t a = (*tokens)[group->rank()], heads = y.size(1), F = y.size(2);
    at::Tensor by_rank = dist::detail::all_to_all_v_raw(y, *tokens, std::vector<int64_t>(U, a), *group, pass);
    return by_rank.reshape({U, a, heads, F}).transpose(0, 1).reshape({a, U * heads, F});
  }
};

// The gathered tokens' attention: the ring's, or the local kernel's on one ring rank.
PartialAttention inner_forward(const StepAttention& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (s.groups.ring->size() == 1) return local_attention_forward(q, k, v, *s.kernels->from[0]);
  return ring_attention_forward(q, k, v, s.groups.ring, *s.kernels);
}
AttentionGrads inner_backward(const StepAttention& s, const at::Tensor& dout, const std::vector<at::Tensor>& saved,
                              size_t at) {
  const at::Tensor &q = saved[at], &k = saved[at + 1], &v = saved[at + 2], &out = saved[at + 3], &lse = saved[at + 4];
  if (s.groups.ring->size() == 1) return local_attention_backward(dout, q, k, v, out, lse, *s.kernels->from[0]);
  return ring_attention_backward(dout, q, k, v, out, lse, s.groups.ring, *s.kernels);
}

// Ulysses around the inner attention: out [T_u, H, D]; saved gets the gathered q, k, v, the
// inner out and lse (what the backward reads).
at::Tensor ulysses_forward(const StepAttention& s, const Exchange& x, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, std::vector<at::Tensor>& saved) {
  const int U = s.groups.ulysses->size();
  const at::Tensor qg = x.scatter(q, Pass::forward), kg = x.scatter(repeated_heads(k, U), Pass::forward),
                   vg = x.scatter(repeated_heads(v, U), Pass::forward);
  PartialAttention r = inner_forward(s, qg, kg, vg);
  saved.insert(saved.end(), {qg, kg, vg, r.out, r.lse});
  return x.gather(r.out, Pass::forward);
}

AttentionGrads ulysses_backward(const StepAttention& s, const Exchange& x, const at::Tensor& dout,
                                const std::vector<at::Tensor>& saved, size_t at, int64_t kv_heads) {
  const at::ScalarType type = saved[at].scalar_type();
  AttentionGrads g = inner_backward(s, x.scatter(dout, Pass::backward), saved, at);
  return {x.gather(g.dq.to(type), Pass::backward), folded_heads(x.gather(g.dk.to(type), Pass::backward), kv_heads),
          folded_heads(x.gather(g.dv.to(type), Pass::backward), kv_heads)};
}

// The five tensors an absent part saves: empty, so that the list keeps its places.
void save_nothing(const at::Tensor& like, std::vector<at::Tensor>& saved) {
  for (int i = 0; i < 5; ++i) saved.push_back(at::empty({0}, like.options()));
}

// A mixed placement's split slots [0, a) and whole slots [a, L) (this rank's).
std::pair<int64_t, int64_t> mixed_split(const StepAttention& s, const at::Tensor& q) {
  const int U = s.groups.ulysses->size(), r = s.groups.ring->rank();
  const int64_t L = s.ring_shares[0].size() / U, a = s.split_slots[r * U + s.groups.ulysses->rank()];
  MMSP_CHECK(q.size(0) == L, "context_attention: this rank holds ", q.size(0), " tokens but the plan gives it ", L,
             " slots");
  return {a, L};
}

std::vector<int64_t> split_tokens(const StepAttention& s) {
  const int U = s.groups.ulysses->size(), r = s.groups.ring->rank();
  return {s.split_slots.begin() + r * U, s.split_slots.begin() + (r + 1) * U};
}

}  // namespace

AttentionForward step_attention_forward(const StepAttention& s, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v) {
  check_attention_inputs(q, k, v, "context_attention");
  const int U = s.groups.ulysses->size();
  check_ulysses_heads(q.size(1), k.size(1), U);
  AttentionForward f;
  if (!s.mixed()) {
    const int64_t share = s.kernels->from[0]->queries;
    MMSP_CHECK(share == q.size(0) * U, "context_attention: this rank holds ", q.size(0),
               " tokens, but its ring share of ", share, " tokens split over ", U, " ulysses ranks gives ", share / U,
               " (pad the share to a multiple of ", U, ")");
    f.out = ulysses_forward(s, Exchange{s.groups.ulysses}, q, k, v, f.saved);
    return f;
  }
  const auto [a, L] = mixed_split(s, q);
  const std::vector<int64_t> tokens = split_tokens(s);
  std::vector<at::Tensor> parts;
  if (s.kernels)  // every ulysses rank takes part, even one with no split slot of its own
    parts.push_back(ulysses_forward(s, Exchange{s.groups.ulysses, &tokens}, q.narrow(0, 0, a), k.narrow(0, 0, a),
                                    v.narrow(0, 0, a), f.saved));
  else
    save_nothing(q, f.saved);
  if (s.whole) {
    const at::Tensor qw = q.narrow(0, a, L - a), kw = k.narrow(0, a, L - a), vw = v.narrow(0, a, L - a);
    PartialAttention r = local_attention_forward(qw, kw, vw, *s.whole);
    f.saved.insert(f.saved.end(), {qw, kw, vw, r.out, r.lse});
    parts.push_back(r.out);
  } else {
    save_nothing(q, f.saved);
  }
  f.out = parts.empty() ? at::zeros_like(q) : parts.size() == 1 ? parts[0] : at::cat(parts, 0);
  return f;
}

AttentionGrads step_attention_backward(const StepAttention& s, const at::Tensor& dout,
                                       const std::vector<at::Tensor>& saved, int64_t kv_heads) {
  if (!s.mixed()) return ulysses_backward(s, Exchange{s.groups.ulysses}, dout, saved, 0, kv_heads);
  const auto [a, L] = mixed_split(s, dout);
  const std::vector<int64_t> tokens = split_tokens(s);
  std::vector<at::Tensor> dq, dk, dv;
  if (s.kernels) {
    AttentionGrads g =
        ulysses_backward(s, Exchange{s.groups.ulysses, &tokens}, dout.narrow(0, 0, a), saved, 0, kv_heads);
    dq.push_back(g.dq), dk.push_back(g.dk), dv.push_back(g.dv);
  }
  if (s.whole) {
    const at::ScalarType type = saved[5].scalar_type();
    AttentionGrads g =
        local_attention_backward(dout.narrow(0, a, L - a), saved[5], saved[6], saved[7], saved[8], saved[9], *s.whole);
    dq.push_back(g.dq.to(type)), dk.push_back(g.dk.to(type)), dv.push_back(g.dv.to(type));
  }
  if (dq.empty()) {  // no slot at all
    const at::TensorOptions o = dout.options();
    return {at::zeros_like(dout), at::zeros({0, kv_heads, dout.size(2)}, o), at::zeros({0, kv_heads, dout.size(2)}, o)};
  }
  return {at::cat(dq, 0), at::cat(dk, 0), at::cat(dv, 0)};
}

namespace {

struct StepHolder : torch::CustomClassHolder {
  std::shared_ptr<const StepAttention> step;
};

// The eager form: the same forward and backward as the torch.library op's.
struct StepAttentionFunction : torch::autograd::Function<StepAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const c10::intrusive_ptr<StepHolder>& holder) {
    AttentionForward f = step_attention_forward(*holder->step, q, k, v);
    ctx->save_for_backward(f.saved);
    ctx->saved_data["step"] = at::IValue::make_capsule(holder);
    ctx->saved_data["kv_heads"] = k.size(1);
    return f.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto capsule = ctx->saved_data["step"].toCapsule();
    const auto* holder = dynamic_cast<const StepHolder*>(capsule.get());
    MMSP_ASSERT(holder != nullptr, "saved capsule is not a StepHolder");
    AttentionGrads g = step_attention_backward(*holder->step, grads[0], ctx->get_saved_variables(),
                                               ctx->saved_data["kv_heads"].toInt());
    return {g.dq, g.dk, g.dv, at::Tensor()};
  }
};

}  // namespace

AttentionFunction attention_function(std::shared_ptr<const StepAttention> step) {
  auto holder = c10::make_intrusive<StepHolder>();
  holder->step = std::move(step);
  return [holder](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return StepAttentionFunction::apply(q, k, v, holder);
  };
}

}  // namespace mmsp::attention
