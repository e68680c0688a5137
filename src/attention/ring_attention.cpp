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

struct RingAttentionFunction : torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v,
                            const dist::GroupPtr& ring, const std::vector<TokenLayout>& shares,
                            const AttentionOptions& options) {
    const int R = ring->size(), r = ring->rank();
    PartialAttention acc;
    std::vector<at::Tensor> kv{k, v};
    for (int step = 0; step < R; ++step) {
      const int src = (r - step + R) % R;
      std::optional<RingExchange> next;
      if (step + 1 < R) {  // pass the block on while we attend to it
        next.emplace(ring, 1, Pass::forward);
        next->start(kv);
      }
      merge_partial(acc, local_attention_forward(q, kv[0], kv[1], shares[r], shares[src], options));
      if (next) kv = next->wait();
    }
    at::Tensor out = acc.out.to(q.scalar_type());
    std::vector<at::Tensor> layout_tensors;
    for (const auto& s : shares) layout_tensors.push_back(s.segment), layout_tensors.push_back(s.order);
    ctx->save_for_backward({q, k, v, out, acc.lse});
    ctx->saved_data["group"] = dist::group_to_ivalue(ring);
    ctx->saved_data["layouts"] = layout_tensors;
    ctx->saved_data["causal"] = options.causal;
    ctx->saved_data["scale"] = options.scale;
    ctx->saved_data["block_q"] = options.block_q;
    ctx->saved_data["block_k"] = options.block_k;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    dist::GroupPtr ring = dist::group_from_ivalue(ctx->saved_data["group"]);
    const auto layout_tensors = ctx->saved_data["layouts"].toTensorVector();
    std::vector<TokenLayout> shares;
    for (size_t i = 0; i < layout_tensors.size(); i += 2)
      shares.push_back({layout_tensors[i], layout_tensors[i + 1]});
    AttentionOptions options;
    options.causal = ctx->saved_data["causal"].toBool();
    options.scale = ctx->saved_data["scale"].toDouble();
    options.block_q = ctx->saved_data["block_q"].toInt();
    options.block_k = ctx->saved_data["block_k"].toInt();

    const int R = ring->size(), r = ring->rank();
    const at::Tensor& dout = grads[0];
    at::Tensor dq;
    std::vector<at::Tensor> kv{k, v}, dkv;  // dkv: gradient so far of the block in hand
    for (int step = 0; step < R; ++step) {
      const int src = (r - step + R) % R;
      std::optional<RingExchange> next_kv;
      if (step + 1 < R) {
        next_kv.emplace(ring, 1, Pass::backward);
        next_kv->start(kv);
      }
      AttentionGrads g = local_attention_backward(dout, q, kv[0], kv[1], out, lse, shares[r],
                                                  shares[src], options);
      dq = dq.defined() ? dq.add_(g.dq) : g.dq;
      // Add our share to the block's gradient and pass it on; after R hops (the
      // last from rank r − 1 carrying block r) each block's gradient is home.
      std::vector<at::Tensor> mine{g.dk.contiguous(), g.dv.contiguous()};
      if (step > 0) mine[0].add_(dkv[0]), mine[1].add_(dkv[1]);
      if (R > 1) {
        RingExchange home(ring, 1, Pass::backward);
        home.start(mine);
        dkv = home.wait();
      } else {
        dkv = mine;
      }
      if (next_kv) kv = next_kv->wait();
    }
    const auto type = q.scalar_type();
    return {dq.to(type), dkv[0].to(type), dkv[1].to(type), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const dist::GroupPtr& ring, const std::vector<TokenLayout>& shares,
                          const AttentionOptions& options) {
  check_attention_inputs(q, k, v, "ring_attention");
  MMSP_CHECK(static_cast<int>(shares.size()) == ring->size(), "ring_attention: ",
             shares.size(), " share layouts given for a ring of ", ring->size(), " ranks");
  for (size_t p = 0; p < shares.size(); ++p) {
    shares[p].check("ring_attention");
    MMSP_CHECK(shares[p].size() == q.size(0), "ring_attention: ring rank ", p, " holds ",
               shares[p].size(), " tokens but this rank has ", q.size(0),
               "; every ring rank must hold the same number (pad each segment to 2 × ring)");
  }
  return RingAttentionFunction::apply(q, k, v, ring, shares, options);
}

}  // namespace mmsp::attention
