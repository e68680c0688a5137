// Ring attention forward/backward as one autograd Function; see ring_attention.h.
// At step s rank r holds the K/V of rank (r − s) mod R.
#include "mmsp/attention/ring_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <optional>

#include "mmsp/core/check.h"
#include "mmsp/dist/ring_exchange.h"

namespace mmsp::attention {
namespace {

using dist::Pass;
using dist::RingExchange;

const RingKernels& kernels_from(const at::IValue& capsule_value, c10::intrusive_ptr<torch::CustomClassHolder>& holder) {
  holder = capsule_value.toCapsule();
  const auto* kernels = dynamic_cast<const RingKernels*>(holder.get());
  MMSP_ASSERT(kernels != nullptr, "saved capsule is not a RingKernels");
  return *kernels;
}

struct RingAttentionFunction : torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const dist::GroupPtr& ring,
                            const c10::intrusive_ptr<RingKernels>& kernels) {
    PartialAttention r = ring_attention_forward(q, k, v, ring, *kernels);
    ctx->save_for_backward({q, k, v, r.out, r.lse});
    ctx->saved_data["group"] = dist::group_to_ivalue(ring);
    ctx->saved_data["kernels"] = at::IValue::make_capsule(kernels);
    return r.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    dist::GroupPtr ring = dist::group_from_ivalue(ctx->saved_data["group"]);
    c10::intrusive_ptr<torch::CustomClassHolder> holder;
    const RingKernels& kernels = kernels_from(ctx->saved_data["kernels"], holder);
    AttentionGrads g =
        ring_attention_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], ring, kernels);
    const auto type = saved[0].scalar_type();
    return {g.dq.to(type), g.dk.to(type), g.dv.to(type), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

PartialAttention ring_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const dist::GroupPtr& ring, const RingKernels& kernels) {
  const int R = ring->size(), r = ring->rank();
  PartialAttention acc;
  std::vector<at::Tensor> kv{k, v};
  for (int step = 0; step < R; ++step) {
    const int src = (r - step + R) % R;
    std::optional<RingExchange> next;
    auto pass_on = [&] {
      if (step + 1 == R) return;
      next.emplace(ring, 1, Pass::forward);
      next->start(kv);
    };
    if (kernels.overlap) pass_on();  // the block travels on while we attend to it
    merge_partial(acc, local_attention_forward(q, kv[0], kv[1], *kernels.from[src]));
    if (!kernels.overlap) pass_on();
    if (next) kv = next->wait();
  }
  return {acc.out.to(q.scalar_type()), acc.lse};
}

AttentionGrads ring_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                       const dist::GroupPtr& ring, const RingKernels& kernels) {
  const int R = ring->size(), r = ring->rank();
  at::Tensor dq;
  std::vector<at::Tensor> kv{k, v}, dkv;  // dkv: gradient so far of the block in hand
  std::optional<RingExchange> home;       // the last block's dK/dV on its way to the next rank
  for (int step = 0; step < R; ++step) {
    const int src = (r - step + R) % R;
    std::optional<RingExchange> next_kv;
    auto pass_on = [&] {
      if (step + 1 == R) return;
      next_kv.emplace(ring, 1, Pass::backward);
      next_kv->start(kv);
    };
    if (kernels.overlap) pass_on();
    AttentionGrads g = local_attention_backward(dout, q, kv[0], kv[1], out, lse, *kernels.from[src]);
    dq = dq.defined() ? dq.add_(g.dq) : g.dq;
    // Add our share to the block's gradient and pass it on; after R hops (the last from
    // rank r − 1 carrying block r) each block's gradient is home. With overlap the hop of
    // step s is waited for here, at step s + 1, after this block's backward.
    std::vector<at::Tensor> mine{g.dk.contiguous(), g.dv.contiguous()};
    if (home) dkv = home->wait(), home.reset();
    if (step > 0) mine[0].add_(dkv[0]), mine[1].add_(dkv[1]);
    if (R > 1) {
      home.emplace(ring, 1, Pass::backward);
      home->start(mine);
      if (!kernels.overlap) dkv = home->wait(), home.reset();
    } else {
      dkv = mine;
    }
    if (!kernels.overlap) pass_on();
    if (next_kv) kv = next_kv->wait();
  }
  if (home) dkv = home->wait();
  return {dq, dkv[0], dkv[1]};
}

c10::intrusive_ptr<RingKernels> plan_ring_kernels(const std::vector<TokenLayout>& shares, int ring_rank,
                                                  const AttentionOptions& options, const at::Device& device) {
  MMSP_CHECK(ring_rank >= 0 && ring_rank < static_cast<int>(shares.size()), "ring_attention: ring rank ", ring_rank,
             " has no share among ", shares.size());
  for (size_t p = 0; p < shares.size(); ++p) {
    shares[p].check("ring_attention");
    MMSP_CHECK(shares[p].size() == shares[ring_rank].size(), "ring_attention: ring rank ", p, " holds ",
               shares[p].size(), " tokens but ring rank ", ring_rank, " holds ", shares[ring_rank].size(),
               "; every ring rank must hold the same number (pad each segment to 2 × ring)");
  }
  auto kernels = c10::make_intrusive<RingKernels>();
  kernels->overlap = options.overlap;
  for (const TokenLayout& keys : shares) kernels->from.push_back(plan_kernel(shares[ring_rank], keys, options, device));
  return kernels;
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const dist::GroupPtr& ring,
                          const c10::intrusive_ptr<RingKernels>& kernels) {
  check_attention_inputs(q, k, v, "ring_attention");
  MMSP_CHECK(static_cast<int>(kernels->from.size()) == ring->size(), "ring_attention: ", kernels->from.size(),
             " share layouts given for a ring of ", ring->size(), " ranks");
  MMSP_CHECK(kernels->from[0]->queries == q.size(0), "ring_attention: this rank's share holds ",
             kernels->from[0]->queries, " tokens but this rank has ", q.size(0),
             "; every ring rank must hold the same number (pad each segment to 2 × ring)");
  return RingAttentionFunction::apply(q, k, v, ring, kernels);
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const dist::GroupPtr& ring,
                          const std::vector<TokenLayout>& shares, const AttentionOptions& options) {
  check_attention_inputs(q, k, v, "ring_attention");
  MMSP_CHECK(static_cast<int>(shares.size()) == ring->size(), "ring_attention: ", shares.size(),
             " share layouts given for a ring of ", ring->size(), " ranks");
  for (size_t p = 0; p < shares.size(); ++p) {
    shares[p].check("ring_attention");
    MMSP_CHECK(shares[p].size() == q.size(0), "ring_attention: ring rank ", p, " holds ", shares[p].size(),
               " tokens but this rank has ", q.size(0),
               "; every ring rank must hold the same number (pad each segment to 2 × ring)");
  }
  return ring_attention(q, k, v, ring, plan_ring_kernels(shares, ring->rank(), options, q.device()));
}

}  // namespace mmsp::attention
