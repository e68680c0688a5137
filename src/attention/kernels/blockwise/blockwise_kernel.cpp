// The registry's "blockwise" entry: mmsp's own kernel, LibTorch tensor ops only (so it runs
// on the tensors' device, in any floating dtype, fp64 included), segment- and order-masked,
// GQA, causal or bidirectional; never materialises the full score matrix. Backward
// recomputes the scores from the saved log-sum-exp (flash-attention style). Heads are
// grouped by their K/V head: one matmul serves the G = H/H_kv query heads of a group, with
// query rows ordered (token, head-in-group). It serves every tensor: auto's fallback.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "kernels/kernels.h"
#include "mmsp/attention/local_attention.h"

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
at::Tensor heads_first(const at::Tensor& kv, at::ScalarType acc) { return kv.to(acc).permute({1, 0, 2}).contiguous(); }

// Disallowed (query, key) pairs of a partial block, [bq, 1, bk] bool on the device.
at::Tensor disallowed_pairs(const TokenLayout& q, const TokenLayout& k, int64_t i, int64_t bq, const KeyBlock& kb,
                            bool causal, const at::Device& device) {
  at::Tensor qs = q.segment.narrow(0, i, bq).unsqueeze(1);
  at::Tensor ks = k.segment.narrow(0, kb.begin, kb.end - kb.begin).unsqueeze(0);
  at::Tensor allowed = qs.eq(ks).logical_and_(ks.ge(0));
  if (causal)
    allowed.logical_and_(
        k.order.narrow(0, kb.begin, kb.end - kb.begin).unsqueeze(0).le(q.order.narrow(0, i, bq).unsqueeze(1)));
  return allowed.logical_not_().unsqueeze(1).to(device);
}

// The kernel's index work for one pair of layouts: which key blocks each query block
// attends and, for each partial block, its disallowed (query, key) pairs on the device.
struct BlockwisePart : KernelPart {
  int64_t queries = 0;
  BlockSchedule schedule;
  // [query block][its key block]: disallowed pairs [bq, 1, bk] bool; undefined for a full block
  std::vector<std::vector<at::Tensor>> masks;
};

// Calls fn(i, bq, blocks, masks) for every block of queries [i, i + bq) that
// attends to something: blocks are its key blocks, masks[b] the disallowed pairs
// of partial block b (undefined for a full block). Masks are shared by all heads.
template <typename Fn>
void for_each_query_block(const BlockwisePart& plan, const AttentionOptions& options, Fn&& fn) {
  const int64_t block_q = options.block_q;
  for (size_t qb = 0; qb < plan.schedule.key_blocks.size(); ++qb) {
    const std::vector<KeyBlock>& blocks = plan.schedule.key_blocks[qb];
    if (blocks.empty()) continue;
    const int64_t i = static_cast<int64_t>(qb) * block_q;
    fn(i, std::min(block_q, plan.queries - i), blocks, plan.masks[qb]);
  }
}

class BlockwiseKernel : public LocalKernel {
 public:
  const char* name() const override { return "blockwise"; }
  bool automatic_on(const at::Device&) const override { return true; }

  std::shared_ptr<const KernelPart> plan(const TokenLayout& q_layout, const TokenLayout& k_layout,
                                         const AttentionOptions& options, const at::Device& device,
                                         std::string*) const override {
    auto part = std::make_shared<BlockwisePart>();
    part->queries = q_layout.size();
    part->schedule = BlockSchedule::make(q_layout, k_layout, options.causal, options.block_q, options.block_k);
    part->masks.resize(part->schedule.key_blocks.size());
    for (size_t qb = 0; qb < part->schedule.key_blocks.size(); ++qb) {
      const int64_t i = static_cast<int64_t>(qb) * options.block_q;
      const int64_t bq = std::min(options.block_q, part->queries - i);
      for (const KeyBlock& kb : part->schedule.key_blocks[qb])
        part->masks[qb].push_back(kb.full ? at::Tensor()
                                          : disallowed_pairs(q_layout, k_layout, i, bq, kb, options.causal, device));
    }
    return part;
  }

  const char* serves(const at::Tensor&, std::string*) const override { return "blockwise"; }

  PartialAttention forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KernelPart& plan,
                           const AttentionOptions& options) const override {
    const auto& part = static_cast<const BlockwisePart&>(plan);
    const Shapes s = shapes_of(q, k, options);
    const at::ScalarType acc = accumulation_type(q.scalar_type());
    // [H_kv, Tq, G, D], pre-scaled so the scores need no extra pass
    const at::Tensor qh = group_queries(q, s, acc).mul(s.scale);
    const at::Tensor kh = heads_first(k, acc);  // [H_kv, Tk, D]
    const at::Tensor vh = heads_first(v, acc);
    at::Tensor out = at::zeros({s.Hkv, s.Tq, s.G, s.D}, qh.options());
    at::Tensor lse = at::full({s.Hkv, s.Tq, s.G}, -kInf, qh.options());

    for_each_query_block(
        part, options,
        [&](int64_t i, int64_t bq, const std::vector<KeyBlock>& blocks, const std::vector<at::Tensor>& masks) {
          const int64_t rows = bq * s.G;
          for (int64_t h = 0; h < s.Hkv; ++h) {
            const at::Tensor Q = qh[h].narrow(0, i, bq).view({rows, s.D});
            at::Tensor m = at::full({rows}, -kInf, qh.options());  // running max
            at::Tensor l = at::zeros({rows}, qh.options());        // running sum of exp
            at::Tensor o = at::zeros({rows, s.D}, qh.options());   // running numerator
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
            out[h]
                .narrow(0, i, bq)
                .view({rows, s.D})
                .copy_(o.div_(l.masked_fill(has_keys.logical_not(), 1).unsqueeze(1)));
            lse[h].narrow(0, i, bq).view({rows}).copy_(
                at::where(has_keys, m + l.log(), at::full({}, -kInf, qh.options())));
          }
        });
    return {ungroup_queries(out, s).to(q.scalar_type()), lse.permute({1, 0, 2}).reshape({s.Tq, s.H})};
  }

  AttentionGrads backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const KernelPart& plan,
                          const AttentionOptions& options) const override {
    const auto& part = static_cast<const BlockwisePart&>(plan);
    const Shapes s = shapes_of(q, k, options);
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

    for_each_query_block(
        part, options,
        [&](int64_t i, int64_t bq, const std::vector<KeyBlock>& blocks, const std::vector<at::Tensor>& masks) {
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
};

}  // namespace

const LocalKernel& blockwise_kernel() {
  static const BlockwiseKernel kernel;
  return kernel;
}

}  // namespace mmsp::attention
