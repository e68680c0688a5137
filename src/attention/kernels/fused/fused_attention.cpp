// Local attention through ATen's fused kernels; see fused_attention.h.
//
// The layouts become pieces: a run is a stretch of rows of one segment whose orders
// count up by one (a packed segment, a zigzag chunk); a (query run, key run) pair of one
// segment gives at most two pieces under causal masking — queries that see a growing
// prefix of the keys (bottom-right aligned causal) and queries that see them all (full) —
// and one full piece without. Pieces go into calls so that no query row repeats within
// a call; calls of one query row cover disjoint keys and merge by lse like ring steps.
#include "mmsp/attention/kernels/fused_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <map>

#include "mmsp/attention/local_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/core/phase_timer.h"

namespace mmsp::attention {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Run {
  int64_t segment, row, length, order;  // rows [row, row + length), orders [order, order + length)
};

std::vector<Run> order_runs(const TokenLayout& layout) {
  const at::Tensor seg_t = layout.segment.contiguous(), ord_t = layout.order.contiguous();
  const int64_t* seg = seg_t.data_ptr<int64_t>();
  const int64_t* ord = ord_t.data_ptr<int64_t>();
  std::vector<Run> runs;
  for (int64_t i = 0; i < layout.size(); ++i) {
    if (seg[i] < 0) continue;
    if (!runs.empty()) {
      Run& r = runs.back();
      if (r.segment == seg[i] && r.row + r.length == i && r.order + r.length == ord[i]) {
        ++r.length;
        continue;
      }
    }
    runs.push_back({seg[i], i, 1, ord[i]});
  }
  return runs;
}

struct Piece {
  bool causal;
  VarlenPiece rows;
};

// The pieces of one (query run, key run) pair of the same segment.
void pieces_of(const Run& q, const Run& k, bool causal, CausalAlignment alignment, std::vector<Piece>& out) {
  if (!causal) {
    out.push_back({false, {q.row, q.length, k.row, k.length}});
    return;
  }
  // A query of order o sees the keys of order <= o: none below k.order, a prefix up to
  // the run's last key, all from there on.
  // The query of the last key's order sees every key and closes the causal piece (so a
  // run against itself is one piece).
  const int64_t k_end = k.order + k.length;
  const int64_t q_end = q.order + q.length;
  const int64_t p0 = std::max(q.order, k.order), p1 = std::min(q_end, k_end);  // prefix queries
  if (p1 > p0) {
    const int64_t keys = p1 - k.order;  // the last prefix query (order p1 - 1) sees these
    const int64_t queries = p1 - p0, first = q.row + (p0 - q.order), before = keys - queries;
    if (alignment == CausalAlignment::square_only && before > 0) {       // keys >= queries always
      out.push_back({false, {first, queries, k.row, before}});           // keys every one of them sees
      out.push_back({true, {first, queries, k.row + before, queries}});  // a square causal piece
    } else {
      out.push_back({true, {first, queries, k.row, keys}});
    }
  }
  const int64_t f0 = std::max(q.order, k_end);  // queries past every key of the run
  if (q_end > f0) out.push_back({false, {q.row + (f0 - q.order), q_end - f0, k.row, k.length}});
}

// Rows [begin, begin + length) of every piece, in order; undefined where that is 0..n-1.
at::Tensor packed_rows(const std::vector<VarlenPiece>& pieces, bool keys, int64_t n, const at::Device& device) {
  std::vector<int64_t> rows;
  for (const VarlenPiece& p : pieces) {
    const int64_t b = keys ? p.k_begin : p.q_begin, l = keys ? p.k_length : p.q_length;
    for (int64_t i = 0; i < l; ++i) rows.push_back(b + i);
  }
  bool identity = static_cast<int64_t>(rows.size()) == n;
  for (size_t i = 0; identity && i < rows.size(); ++i) identity = rows[i] == static_cast<int64_t>(i);
  if (identity) return at::Tensor();
  return at::tensor(rows, at::kLong).to(device);
}

at::Tensor starts(const std::vector<VarlenPiece>& pieces, bool keys, const at::Device& device, int64_t& max_len,
                  int64_t& total) {
  std::vector<int32_t> cum{0};
  max_len = 0;
  for (const VarlenPiece& p : pieces) {
    const int64_t l = keys ? p.k_length : p.q_length;
    max_len = std::max(max_len, l);
    cum.push_back(static_cast<int32_t>(cum.back() + l));
  }
  total = cum.back();
  return at::tensor(cum, at::kInt).to(device);
}

at::Tensor gather(const at::Tensor& x, const at::Tensor& rows) { return rows.defined() ? x.index_select(0, rows) : x; }

// A piece's mask in the CPU kernel's terms: a square causal piece is the kernel's own
// causal flag (top-left and bottom-right alignment agree); a wider one an additive bias,
// bottom-right aligned; a full piece neither.
struct CpuMask {
  bool is_causal = false;
  std::optional<at::Tensor> bias;
};
CpuMask cpu_mask(const VarlenCall& call, const VarlenPiece& p, const at::TensorOptions& options) {
  if (!call.causal) return {};
  if (p.q_length == p.k_length) return {true, std::nullopt};
  const at::Tensor i = at::arange(p.q_length, at::kLong).unsqueeze(1),
                   j = at::arange(p.k_length, at::kLong).unsqueeze(0);
  return {false, at::zeros({p.q_length, p.k_length}, options)
                     .masked_fill_(j.gt(i + (p.k_length - p.q_length)).to(options.device()), -kInf)};
}

at::Tensor heads_expanded(const at::Tensor& kv, int64_t groups) {  // [n, Hkv, D] -> [1, H, n, D]
  return kv.repeat_interleave(groups, 1).permute({1, 0, 2}).unsqueeze(0);
}

// One call on the CPU flash kernel, piece by piece: out [n, H, D], lse [n, H].
PartialAttention cpu_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const VarlenCall& call,
                          double scale) {
  const int64_t G = q.size(1) / k.size(1);
  std::vector<at::Tensor> outs, lses;
  int64_t qo = 0, ko = 0;
  for (const VarlenPiece& p : call.pieces) {
    const at::Tensor qi = q.narrow(0, qo, p.q_length).permute({1, 0, 2}).unsqueeze(0);
    const at::Tensor ki = heads_expanded(k.narrow(0, ko, p.k_length), G);
    const at::Tensor vi = heads_expanded(v.narrow(0, ko, p.k_length), G);
    const CpuMask mask = cpu_mask(call, p, q.options());
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(qi, ki, vi, 0.0, mask.is_causal, mask.bias, scale);
    outs.push_back(o.squeeze(0).permute({1, 0, 2}));
    lses.push_back(lse.squeeze(0).t());
    qo += p.q_length, ko += p.k_length;
  }
  return {at::cat(outs), at::cat(lses)};
}

AttentionGrads cpu_call_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& out, const at::Tensor& lse, const VarlenCall& call, double scale) {
  const int64_t Hkv = k.size(1), G = q.size(1) / Hkv, D = q.size(2);
  std::vector<at::Tensor> dqs, dks, dvs;
  int64_t qo = 0, ko = 0;
  auto heads_first = [](const at::Tensor& x) { return x.permute({1, 0, 2}).unsqueeze(0); };
  auto grouped = [&](const at::Tensor& g, int64_t n) {  // [1, H, n, D] -> [n, Hkv, D]
    return g.squeeze(0).permute({1, 0, 2}).reshape({n, Hkv, G, D}).sum(2);
  };
  for (const VarlenPiece& p : call.pieces) {
    const at::Tensor ki = heads_expanded(k.narrow(0, ko, p.k_length), G);
    const at::Tensor vi = heads_expanded(v.narrow(0, ko, p.k_length), G);
    const CpuMask mask = cpu_mask(call, p, q.options());
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        heads_first(dout.narrow(0, qo, p.q_length)).contiguous(), heads_first(q.narrow(0, qo, p.q_length)), ki, vi,
        heads_first(out.narrow(0, qo, p.q_length)).contiguous(),
        lse.narrow(0, qo, p.q_length).t().unsqueeze(0).contiguous(), 0.0, mask.is_causal, mask.bias, scale);
    dqs.push_back(dq.squeeze(0).permute({1, 0, 2}));
    dks.push_back(grouped(dk, p.k_length));
    dvs.push_back(grouped(dv, p.k_length));
    qo += p.q_length, ko += p.k_length;
  }
  return {at::cat(dqs), at::cat(dks), at::cat(dvs)};
}

// FlashAttention-2 varlen (ATen's own build of it): one launch per call.
PartialAttention cuda_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const VarlenCall& call,
                           double scale) {
  auto r = at::_flash_attention_forward(q, k, v, call.cum_q, call.cum_k, call.max_q, call.max_k,
                                        /*dropout_p=*/0.0, call.causal, /*return_debug_mask=*/false,
                                        std::optional<double>(scale));
  const at::Tensor& lse = std::get<1>(r);  // [heads, total_q] fp32 in the varlen form
  MMSP_CHECK(lse.dim() == 2 && lse.size(0) == q.size(1) && lse.size(1) == call.total_q,
             "flash-varlen: this LibTorch returns the log-sum-exp as ", lse.sizes(), ", not [", q.size(1), ", ",
             call.total_q, "]: run with --attention-kernel blockwise");
  return {std::get<0>(r), lse.t()};
}

AttentionGrads cuda_call_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& out, const at::Tensor& lse, const VarlenCall& call, double scale) {
  // No dropout: the kernel never reads the philox state.
  const at::Tensor unused = at::zeros({2}, q.options().dtype(at::kLong));
  auto r = at::_flash_attention_backward(dout.contiguous(), q, k, v, out.contiguous(), lse.t().contiguous(), call.cum_q,
                                         call.cum_k, call.max_q, call.max_k, /*dropout_p=*/0.0, call.causal, unused,
                                         unused, std::optional<double>(scale));
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

}  // namespace

std::optional<FusedPlan> plan_fused(const TokenLayout& q_layout, const TokenLayout& k_layout, bool causal,
                                    const at::Device& device, std::string* why_not, int64_t max_pieces,
                                    CausalAlignment alignment) {
  q_layout.check("fused attention (queries)");
  k_layout.check("fused attention (keys)");
  const std::vector<Run> q_runs = order_runs(q_layout), k_runs = order_runs(k_layout);
  std::map<int64_t, std::vector<const Run*>> keys_of;
  for (const Run& r : k_runs) keys_of[r.segment].push_back(&r);
  std::vector<Piece> pieces;
  for (const Run& q : q_runs) {
    auto it = keys_of.find(q.segment);
    if (it == keys_of.end()) continue;
    for (const Run* k : it->second) pieces_of(q, *k, causal, alignment, pieces);
    if (static_cast<int64_t>(pieces.size()) > max_pieces) {
      if (why_not)
        *why_not = "the layouts fall into more than " + std::to_string(max_pieces) + " (query run, key run) pieces (" +
                   std::to_string(q_runs.size()) + " query runs, " + std::to_string(k_runs.size()) + " key runs)";
      return std::nullopt;
    }
  }
  FusedPlan plan;
  plan.queries = q_layout.size();
  plan.keys = k_layout.size();
  // Greedy: a piece joins the first call of its kind that has none of its query rows.
  std::vector<std::vector<uint8_t>> used;
  for (const Piece& p : pieces) {
    size_t c = 0;
    for (; c < plan.calls.size(); ++c) {
      if (plan.calls[c].causal != p.causal) continue;
      const uint8_t* u = used[c].data() + p.rows.q_begin;
      if (std::none_of(u, u + p.rows.q_length, [](uint8_t x) { return x != 0; })) break;
    }
    if (c == plan.calls.size()) {
      plan.calls.push_back({});
      plan.calls.back().causal = p.causal;
      used.emplace_back(static_cast<size_t>(plan.queries), 0);
    }
    plan.calls[c].pieces.push_back(p.rows);
    std::fill_n(used[c].data() + p.rows.q_begin, p.rows.q_length, uint8_t{1});
  }
  for (VarlenCall& call : plan.calls) {
    call.q_rows = packed_rows(call.pieces, false, plan.queries, device);
    call.k_rows = packed_rows(call.pieces, true, plan.keys, device);
    call.cum_q = starts(call.pieces, false, device, call.max_q, call.total_q);
    call.cum_k = starts(call.pieces, true, device, call.max_k, call.total_k);
  }
  return plan;
}

const char* fused_kernel_for(const at::Tensor& q, std::string* why_not) {
  const auto type = q.scalar_type();
  if (q.is_cpu()) return "cpu-flash";
  if (q.is_cuda()) {
    const int64_t D = q.size(-1);
    if ((type == at::kBFloat16 || type == at::kHalf) && D % 8 == 0 && D <= 256) return "flash-varlen";
    if (why_not)
      *why_not =
          std::string(
              "FlashAttention-2 on CUDA takes bf16/fp16 with a head size that is a multiple of 8 up to 256, got ") +
          c10::toString(type) + " and head size " + std::to_string(D);
    return nullptr;
  }
  if (why_not) *why_not = "no fused kernel for tensors on " + q.device().str();
  return nullptr;
}

PartialAttention varlen_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const FusedPlan& plan, double scale, const VarlenForward& run) {
  PhaseScope timed(Phase::attention);
  const at::ScalarType acc = accumulation_type(q.scalar_type());
  PartialAttention total;
  for (const VarlenCall& call : plan.calls) {
    const at::Tensor qp = gather(q, call.q_rows), kp = gather(k, call.k_rows), vp = gather(v, call.k_rows);
    PartialAttention part = run(qp, kp, vp, call, scale);
    part.lse = part.lse.to(acc);
    if (plan.calls.size() == 1 && !call.q_rows.defined()) return part;  // every row, once
    PartialAttention full{at::zeros({plan.queries, q.size(1), q.size(2)}, q.options().dtype(acc)),
                          at::full({plan.queries, q.size(1)}, -kInf, q.options().dtype(acc))};
    const at::Tensor rows =
        call.q_rows.defined() ? call.q_rows : at::arange(plan.queries, q.options().dtype(at::kLong));
    full.out.index_copy_(0, rows, part.out.to(acc));
    full.lse.index_copy_(0, rows, part.lse);
    merge_partial(total, full);
  }
  if (!total.out.defined())  // no query sees any key
    return {at::zeros_like(q), at::full({plan.queries, q.size(1)}, -kInf, q.options().dtype(acc))};
  return {total.out.to(q.scalar_type()), total.lse};
}

AttentionGrads varlen_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                         const FusedPlan& plan, double scale, const VarlenBackward& run) {
  PhaseScope timed(Phase::attention);
  const at::ScalarType acc = accumulation_type(q.scalar_type());
  at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(acc));
  at::Tensor dk = at::zeros(k.sizes(), k.options().dtype(acc)), dv = at::zeros(v.sizes(), v.options().dtype(acc));
  const at::Tensor out_q = out.to(q.scalar_type()), dout_q = dout.to(q.scalar_type());
  for (const VarlenCall& call : plan.calls) {
    const at::Tensor qp = gather(q, call.q_rows), kp = gather(k, call.k_rows), vp = gather(v, call.k_rows);
    const at::Tensor dop = gather(dout_q, call.q_rows), op = gather(out_q, call.q_rows);
    AttentionGrads g = run(dop, qp, kp, vp, op, gather(lse, call.q_rows).to(acc), call, scale);
    if (call.q_rows.defined())
      dq.index_add_(0, call.q_rows, g.dq.to(acc));
    else
      dq.add_(g.dq.to(acc));
    if (call.k_rows.defined()) {
      dk.index_add_(0, call.k_rows, g.dk.to(acc));
      dv.index_add_(0, call.k_rows, g.dv.to(acc));
    } else {
      dk.add_(g.dk.to(acc));
      dv.add_(g.dv.to(acc));
    }
  }
  return {dq, dk, dv};
}

PartialAttention fused_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const FusedPlan& plan, double scale) {
  const bool cuda = q.is_cuda();
  return varlen_attention_forward(
      q, k, v, plan, scale,
      [cuda](const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp, const VarlenCall& call, double s) {
        return cuda ? cuda_call(qp.contiguous(), kp.contiguous(), vp.contiguous(), call, s)
                    : cpu_call(qp, kp, vp, call, s);
      });
}

AttentionGrads fused_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                        const FusedPlan& plan, double scale) {
  const bool cuda = q.is_cuda();
  return varlen_attention_backward(
      dout, q, k, v, out, lse, plan, scale,
      [cuda](const at::Tensor& dop, const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp,
             const at::Tensor& op, const at::Tensor& lp, const VarlenCall& call, double s) {
        return cuda ? cuda_call_backward(dop, qp.contiguous(), kp.contiguous(), vp.contiguous(), op, lp, call, s)
                    : cpu_call_backward(dop, qp, kp, vp, op, lp, call, s);
      });
}

}  // namespace mmsp::attention
