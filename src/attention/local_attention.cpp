// Local attention through the registry's kernels; see local_attention.h.
#include "mmsp/attention/local_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>

#include "mmsp/core/check.h"
#include "mmsp/core/phase_timer.h"

namespace mmsp::attention {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_plan_fits(const KernelPlan& plan, const at::Tensor& q, const at::Tensor& k) {
  MMSP_CHECK(plan.queries == q.size(0) && plan.keys == k.size(0), "local_attention: layouts cover ", plan.queries,
             " queries and ", plan.keys, " keys, tensors have ", q.size(0), " and ", k.size(0));
}

// The candidate that runs for these tensors (kernel_in_use's), with its implementation's name.
const PlannedKernel& running(const KernelPlan& plan, const at::Tensor& q, const char** implementation = nullptr) {
  std::string why_not;
  for (const PlannedKernel& c : plan.candidates) {
    const char* serving = c.kernel->serves(q, &why_not);
    if (serving == nullptr) continue;
    if (implementation) *implementation = serving;
    return c;
  }
  MMSP_CHECK(!plan.options.kernel.automatic(), "local_attention: no kernel serves these tensors");
  MMSP_FAIL("local_attention: the ", plan.options.kernel.pinned->name(), " kernel was asked for, but ", why_not);
}

}  // namespace

KernelPlanPtr plan_kernel(const TokenLayout& q_layout, const TokenLayout& k_layout, const AttentionOptions& options,
                          const at::Device& device) {
  q_layout.check("local_attention (queries)");
  k_layout.check("local_attention (keys)");
  auto plan = c10::make_intrusive<KernelPlan>();
  plan->queries = q_layout.size();
  plan->keys = k_layout.size();
  plan->options = options;
  for (const LocalKernel* kernel : local_kernels()) {
    const bool pinned = kernel == options.kernel.pinned;
    if (!pinned && !(options.kernel.automatic() && kernel->automatic_on(device))) continue;
    std::string why_not;
    std::shared_ptr<const KernelPart> part = kernel->plan(q_layout, k_layout, options, device, &why_not);
    MMSP_CHECK(part || !pinned, "local_attention: the ", kernel->name(), " kernel was asked for, but ", why_not);
    if (part) plan->candidates.push_back({kernel, std::move(part)});
  }
  MMSP_ASSERT(!plan->candidates.empty(), "the registry's blockwise kernel plans every layout");
  return plan;
}

const char* kernel_in_use(const KernelPlan& plan, const at::Tensor& q) {
  const char* implementation = nullptr;
  running(plan, q, &implementation);
  return implementation;
}

at::ScalarType accumulation_type(at::ScalarType type) { return type == at::kDouble ? at::kDouble : at::kFloat; }

void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* what) {
  MMSP_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, what, ": q, k, v must be [tokens, heads, dim], got ",
             q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  MMSP_CHECK(k.sizes() == v.sizes(), what, ": k ", k.sizes(), " and v ", v.sizes(), " must have the same shape");
  MMSP_CHECK(q.size(2) == k.size(2), what, ": q head size ", q.size(2), " differs from k head size ", k.size(2));
  MMSP_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, what, ": query heads (", q.size(1),
             ") must be a multiple of key/value heads (", k.size(1), ")");
  MMSP_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), what,
             ": q, k, v dtypes differ (", q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type(), ")");
  MMSP_CHECK(at::isFloatingType(q.scalar_type()), what, ": dtype ", q.scalar_type(), " is not a floating type");
}

PartialAttention local_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const TokenLayout& q_layout, const TokenLayout& k_layout,
                                         const AttentionOptions& options) {
  check_attention_inputs(q, k, v, "local_attention");
  return local_attention_forward(q, k, v, *plan_kernel(q_layout, k_layout, options, q.device()));
}

PartialAttention local_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const KernelPlan& plan) {
  PhaseScope timed(Phase::attention);
  check_attention_inputs(q, k, v, "local_attention");
  check_plan_fits(plan, q, k);
  const PlannedKernel& c = running(plan, q);
  return c.kernel->forward(q, k, v, *c.part, plan.options);
}

AttentionGrads local_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                        const TokenLayout& q_layout, const TokenLayout& k_layout,
                                        const AttentionOptions& options) {
  return local_attention_backward(dout, q, k, v, out, lse, *plan_kernel(q_layout, k_layout, options, q.device()));
}

AttentionGrads local_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                        const KernelPlan& plan) {
  PhaseScope timed(Phase::attention);
  check_plan_fits(plan, q, k);
  const PlannedKernel& c = running(plan, q);
  return c.kernel->backward(dout, q, k, v, out, lse, *c.part, plan.options);
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
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const KernelPlanPtr& plan) {
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

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KernelPlanPtr& plan) {
  return LocalAttentionFunction::apply(q, k, v, plan);
}

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const TokenLayout& q_layout,
                           const TokenLayout& k_layout, const AttentionOptions& options) {
  check_attention_inputs(q, k, v, "local_attention");
  return local_attention(q, k, v, plan_kernel(q_layout, k_layout, options, q.device()));
}

}  // namespace mmsp::attention
