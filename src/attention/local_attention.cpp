// Blockwise local attention, forward and backward; see local_attention.h.
// Heads are grouped by their K/V head (GQA): one matmul serves the G = H/H_kv query
// heads of a group, with query rows ordered (token, head-in-group).
#include "mmsp/attention/local_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <string_view>

#include "mmsp/core/check.h"
#include "mmsp/core/phase_timer.h"

namespace mmsp::attention {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Shapes {
  int64_t Tq, Tk, H, Hkv, G, D;
  double scale;
};

Shapes shapes_of(const at::Tensor& q, const at::Tensor& k, const AttentionOptions& o) {
  Shapes s{q.size(0), k.size(0), q.size(1), k.size(1), q.size(1) / k.size(1), q.size(2), o.scale};
  if (s.scale == 0) s.scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  return s;
}

// q [Tq, H, D] -> [H_kv, Tq, G, D]; k/v [Tk, H_kv, D] -> [H_kv, Tk, D]; in `acc` dtype.
at::Tensor group_queries(const at::Tensor& q, const Shapes& s, at::ScalarType acc) {
  return q.to(acc).view({s.Tq, s.Hkv, s.G, s.D}).permute({1, 0, 2, 3}).contiguous();
}
at::Tensor ungroup_queries(const at::Tensor& x, const Shapes& s) {  // inverse of the above
  return x.permute({1, 0, 2, 3}).reshape({s.Tq, s.H, s.D});
}
at::Tensor heads_first(const at::Tensor& kv, at::ScalarType acc) {
  return kv.to(acc).permute({1, 0, 2}).contiguous();
}

// Disallowed (query, key) pairs of a partial block, [bq, 1, bk] bool on the device.
at::Tensor disallowed_pairs(const TokenLayout& q, const TokenLayout& k, int64_t i, int64_t bq,
                            const KeyBlock& kb, bool causal, const at::Device& device) {
  at::Tensor qs = q.segment.narrow(0, i, bq).unsqueeze(1);
  at::Tensor ks = k.segment.narrow(0, kb.begin, kb.end - kb.begin).unsqueeze(0);
  at::Tensor allowed = qs.eq(ks).logical_and_(ks.ge(0));
  if (causal)
    allowed.logical_and_(k.order.narrow(0, kb.begin, kb.end - kb.begin).unsqueeze(0).le(
        q.order.narrow(0, i, bq).unsqueeze(1)));
  return allowed.logical_not_().unsqueeze(1).to(device);
}

// Calls fn(i, bq, blocks, masks) for every block of queries [i, i + bq) that
// attends to something: blocks are its key blocks, masks[b] the disallowed pairs
// of partial block b (undefined for a full block). Masks are shared by all heads.
template <typename Fn>
void for_each_query_block(const KernelPlan& plan, Fn&& fn) {
  const int64_t block_q = plan.options.block_q;
  for (size_t qb = 0; qb < plan.schedule.key_blocks.size(); ++qb) {
    const std::vector<KeyBlock>& blocks = plan.schedule.key_blocks[qb];
    if (blocks.empty()) continue;
    const int64_t i = static_cast<int64_t>(qb) * block_q;
    fn(i, std::min(block_q, plan.queries - i), blocks, plan.masks[qb]);
  }
}

void check_plan_fits(const KernelPlan& plan, const at::Tensor& q, const at::Tensor& k) {
  MMSP_CHECK(plan.queries == q.size(0) && plan.keys == k.size(0), "local_attention: layouts cover ",
             plan.queries, " queries and ", plan.keys, " keys, tensors have ", q.size(0), " and ", k.size(0));
}

}  // namespace

KernelPlanPtr plan_kernel(const TokenLayout& q_layout, const TokenLayout& k_layout,
                          const AttentionOptions& options, const at::Device& device) {
  q_layout.check("local_attention (queries)");
  k_layout.check("local_attention (keys)");
  auto plan = c10::make_intrusive<KernelPlan>();
  plan->queries = q_layout.size();
  plan->keys = k_layout.size();
  plan->options = options;
  if (options.kernel == AttentionKernel::fused ||
      (options.kernel == AttentionKernel::automatic && device.is_cuda())) {
    std::string why_not;
    auto fused = plan_fused(q_layout, k_layout, options.causal, device, &why_not);
    MMSP_CHECK(fused || options.kernel != AttentionKernel::fused, "local_attention: the fused kernel was asked for, but ", why_not);
    if (fused) plan->fused = std::make_shared<const FusedPlan>(std::move(*fused));
  }
  plan->schedule = BlockSchedule::make(q_layout, k_layout, options.causal, options.block_q, options.block_k);
  if (options.kernel == AttentionKernel::fused) return plan;
  plan->masks.resize(plan->schedule.key_blocks.size());
  for (size_t qb = 0; qb < plan->schedule.key_blocks.size(); ++qb) {
    const int64_t i = static_cast<int64_t>(qb) * options.block_q;
    const int64_t bq = std::min(options.block_q, plan->queries - i);
    for (const KeyBlock& kb : plan->schedule.key_blocks[qb])
      plan->masks[qb].push_back(kb.full ? at::Tensor()
                                        : disallowed_pairs(q_layout, k_layout, i, bq, kb, options.causal, device));
  }
  return plan;
}

const char* kernel_in_use(const KernelPlan& plan, const at::Tensor& q) {
  if (plan.options.kernel == AttentionKernel::blockwise || !plan.fused) return "blockwise";
  std::string why_not;
  const char* fused = fused_kernel_for(q, &why_not);
  if (plan.options.kernel == AttentionKernel::fused) {
    MMSP_CHECK(fused != nullptr, "local_attention: the fused kernel was asked for, but ", why_not);
    return fused;
  }
  // automatic: mmsp's blockwise kernel on the CPU (measured faster there), fused on CUDA.
  return fused != nullptr && q.is_cuda() ? fused : "blockwise";
}

namespace {
bool runs_fused(const KernelPlan& plan, const at::Tensor& q) {
  return std::string_view(kernel_in_use(plan, q)) != "blockwise";
}
double scale_of(const at::Tensor& q, const AttentionOptions& o) {
  return o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
}
}  // namespace

at::ScalarType accumulation_type(at::ScalarType type) {
  return type == at::kDouble ? at::kDouble : at::kFloat;
}

void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const char* what) {
  MMSP_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, what,
             ": q, k, v must be [tokens, heads, dim], got ", q.sizes(), ", ", k.sizes(), ", ",
             v.sizes());
  MMSP_CHECK(k.sizes() == v.sizes(), what, ": k ", k.sizes(), " and v ", v.sizes(),
             " must have the same shape");
  MMSP_CHECK(q.size(2) == k.size(2), what, ": q head size ", q.size(2),
             " differs from k head size ", k.size(2));
  MMSP_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, what, ": query heads (", q.size(1),
             ") must be a multiple of key/value heads (", k.size(1), ")");
  MMSP_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), what,
             ": q, k, v dtypes differ (", q.scalar_type(), ", ", k.scalar_type(), ", ",
             v.scalar_type(), ")");
  MMSP_CHECK(at::isFloatingType(q.scalar_type()), what, ": dtype ", q.scalar_type(),
             " is not a floating type");
}

PartialAttention local_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const TokenLayout& q_layout,
                                         const TokenLayout& k_layout,
                                         const AttentionOptions& options) {
  check_attention_inputs(q, k, v, "local_attention");
  return local_attention_forward(q, k, v, *plan_kernel(q_layout, k_layout, options, q.device()));
}

PartialAttention local_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const KernelPlan& plan) {
  PhaseScope timed(Phase::attention);
  check_attention_inputs(q, k, v, "local_attention");
  check_plan_fits(plan, q, k);
  if (runs_fused(plan, q)) return fused_attention_forward(q, k, v, *plan.fused, scale_of(q, plan.options));
  const Shapes s = shapes_of(q, k, plan.options);
  const at::ScalarType acc = accumulation_type(q.scalar_type());
  // [H_kv, Tq, G, D], pre-scaled so the scores need no extra pass
  const at::Tensor qh = group_queries(q, s, acc).mul(s.scale);
  const at::Tensor kh = heads_first(k, acc);  // [H_kv, Tk, D]
  const at::Tensor vh = heads_first(v, acc);
  at::Tensor out = at::zeros({s.Hkv, s.Tq, s.G, s.D}, qh.options());
  at::Tensor lse = at::full({s.Hkv, s.Tq, s.G}, -kInf, qh.options());

  for_each_query_block(plan, [&](int64_t i, int64_t bq, const std::vector<KeyBlock>& blocks,
                                 const std::vector<at::Tensor>& masks) {
    const int64_t rows = bq * s.G;
    for (int64_t h = 0; h < s.Hkv; ++h) {
      const at::Tensor Q = qh[h].narrow(0, i, bq).view({rows, s.D});
      at::Tensor m = at::full({rows}, -kInf, qh.options());  // running max
      at::Tensor l = at::zeros({rows}, qh.options());         // running sum of exp
      at::Tensor o = at::zeros({rows, s.D}, qh.options());    // running numerator
      for (size_t b = 0; b < blocks.size(); ++b) {
        const int64_t j = blocks[b].begin, bk = blocks[b].end - j;
        at::Tensor S = at::mm(Q, kh[h].narrow(0, j, bk).t());  // [rows, bk], scaled
        if (masks[b].defined()) S.view({bq, s.G, bk}).masked_fill_(masks[b], -kInf);
        const at::Tensor m_new = at::maximum(m, S.amax(1));
        // Rows with nothing allowed so far keep max -inf; shift them by 0 instead.
        const at::Tensor shift = m_new.masked_fill(m_new.eq(-kInf), 0);
        S.sub_(shift.unsqueeze(1)).exp_();  // S now holds P
        const at::Tensor alpha = (m - shift).exp_();
        l.mul_(alpha).add_(S.sum(1));
        o.mul_(alpha.unsqueeze(1)).addmm_(S, vh[h].narrow(0, j, bk));
        m = m_new;
      }
      const at::Tensor has_keys = l.gt(0);
      out[h].narrow(0, i, bq).view({rows, s.D}).copy_(
          o.div_(l.masked_fill(has_keys.logical_not(), 1).unsqueeze(1)));
      lse[h].narrow(0, i, bq).view({rows}).copy_(
          at::where(has_keys, m + l.log(), at::full({}, -kInf, qh.options())));
    }
  });
  return {ungroup_queries(out, s).to(q.scalar_type()), lse.permute({1, 0, 2}).reshape({s.Tq, s.H})};
}

AttentionGrads local_attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& out, const at::Tensor& lse,
                                        const TokenLayout& q_layout, const TokenLayout& k_layout,
                                        const AttentionOptions& options) {
  return local_attention_backward(dout, q, k, v, out, lse, *plan_kernel(q_layout, k_layout, options, q.device()));
}

AttentionGrads local_attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& out, const at::Tensor& lse,
                                        const KernelPlan& plan) {
  PhaseScope timed(Phase::attention);
  check_plan_fits(plan, q, k);
  if (runs_fused(plan, q))
    return fused_attention_backward(dout, q, k, v, out, lse, *plan.fused, scale_of(q, plan.options));
  const Shapes s = shapes_of(q, k, plan.options);
  const at::ScalarType acc = accumulation_type(q.scalar_type());
  const at::Tensor qh = group_queries(q, s, acc).mul(s.scale);  // pre-scaled, as in forward
  const at::Tensor doh = group_queries(dout, s, acc);
  const at::Tensor kh = heads_first(k, acc), vh = heads_first(v, acc);
  // delta_i = sum_d dout_i · out_i  [H_kv, Tq, G]
  const at::Tensor delta = (dout.to(acc) * out.to(acc)).sum(-1).view({s.Tq, s.Hkv, s.G}).permute({1, 0, 2});
  // Rows with no allowed key: P must be 0; lse = +inf makes exp(S - lse) = 0.
  const at::Tensor lse_h = lse.to(acc).view({s.Tq, s.Hkv, s.G}).permute({1, 0, 2});
  const at::Tensor lse_safe = lse_h.masked_fill(lse_h.eq(-kInf), kInf);
  at::Tensor dq = at::zeros_like(qh), dk = at::zeros_like(kh), dv = at::zeros_like(vh);

  for_each_query_block(plan, [&](int64_t i, int64_t bq, const std::vector<KeyBlock>& blocks,
                                 const std::vector<at::Tensor>& masks) {
    const int64_t rows = bq * s.G;
    for (int64_t h = 0; h < s.Hkv; ++h) {
      const at::Tensor Q = qh[h].narrow(0, i, bq).view({rows, s.D});  // scaled
      const at::Tensor dO = doh[h].narrow(0, i, bq).view({rows, s.D});
      const at::Tensor L = lse_safe[h].narrow(0, i, bq).reshape({rows, 1});
      const at::Tensor Dl = delta[h].narrow(0, i, bq).reshape({rows, 1});
      at::Tensor dQ = dq[h].narrow(0, i, bq).view({rows, s.D});
      for (size_t b = 0; b < blocks.size(); ++b) {
        const int64_t j = blocks[b].begin, bk = blocks[b].end - j;
        const at::Tensor K = kh[h].narrow(0, j, bk), V = vh[h].narrow(0, j, bk);
        at::Tensor P = at::mm(Q, K.t());  // [rows, bk], scaled scores
        if (masks[b].defined()) P.view({bq, s.G, bk}).masked_fill_(masks[b], -kInf);
        P.sub_(L).exp_();
        dv[h].narrow(0, j, bk).addmm_(P.t(), dO);
        at::Tensor dS = at::mm(dO, V.t()).sub_(Dl).mul_(P);  // P ⊙ (dP − delta)
        dQ.addmm_(dS, K, /*beta=*/1, /*alpha=*/s.scale);
        dk[h].narrow(0, j, bk).addmm_(dS.t(), Q);  // Q is already scaled
      }
    }
  });
  return {ungroup_queries(dq, s), dk.permute({1, 0, 2}), dv.permute({1, 0, 2})};
}

void merge_partial(PartialAttention& acc, const PartialAttention& part) {
  if (!acc.out.defined()) {
    acc = {part.out.to(part.lse.scalar_type()), part.lse.clone()};
    return;
  }
  const at::Tensor lse = at::logaddexp(acc.lse, part.lse);
  const at::Tensor safe = lse.masked_fill(lse.eq(-kInf), 0);  // both empty: weights 0
  const at::Tensor w_acc = (acc.lse - safe).exp_().unsqueeze(-1);
  const at::Tensor w_part = (part.lse - safe).exp_().unsqueeze(-1);
  acc.out = acc.out * w_acc + part.out.to(acc.out.scalar_type()) * w_part;
  acc.lse = lse;
}

namespace {

// The backward reads the forward's plan (kept as a capsule), so it plans nothing.
struct LocalAttentionFunction : torch::autograd::Function<LocalAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const KernelPlanPtr& plan) {
    PartialAttention r = local_attention_forward(q, k, v, *plan);
    ctx->save_for_backward({q, k, v, r.out, r.lse});
    ctx->saved_data["plan"] = at::IValue::make_capsule(plan);
    return r.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto holder = ctx->saved_data["plan"].toCapsule();
    const auto* plan = dynamic_cast<const KernelPlan*>(holder.get());
    MMSP_ASSERT(plan != nullptr, "saved capsule is not a KernelPlan");
    AttentionGrads g = local_attention_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], *plan);
    const auto type = saved[0].scalar_type();
    return {g.dq.to(type), g.dk.to(type), g.dv.to(type), at::Tensor()};
  }
};

}  // namespace

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const KernelPlanPtr& plan) {
  return LocalAttentionFunction::apply(q, k, v, plan);
}

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const TokenLayout& q_layout, const TokenLayout& k_layout,
                           const AttentionOptions& options) {
  check_attention_inputs(q, k, v, "local_attention");
  return local_attention(q, k, v, plan_kernel(q_layout, k_layout, options, q.device()));
}

}  // namespace mmsp::attention
