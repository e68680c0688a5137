// Gated DeltaNet state passing and conv context across the ring; see gated_delta_ring.h.
// A run that starts mid-segment has its initial state folded from the runs before it:
//   S0(run) = M(pred) S0(pred) + F(pred),  S0 = 0 at the segment start,
// and its outputs corrected by out_t += q_eff_t S0(run) (linear in S0).
#include "mmsp/attention/linear/gated_delta_ring.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <functional>
#include <map>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"

namespace mmsp::attention {

RingRuns RingRuns::make(const std::vector<TokenLayout>& shares) {
  RingRuns result;
  std::map<std::pair<int64_t, int64_t>, std::pair<int, int>> by_last;  // (segment, last order)
  for (size_t p = 0; p < shares.size(); ++p) {
    result.runs.push_back(token_runs(shares[p]));
    for (size_t j = 0; j < result.runs[p].size(); ++j) {
      const TokenRun& run = result.runs[p][j];
      by_last[{run.segment, run.last_order()}] = {static_cast<int>(p), static_cast<int>(j)};
    }
  }
  for (size_t p = 0; p < shares.size(); ++p) {
    result.pred.emplace_back();
    for (const TokenRun& run : result.runs[p]) {
      if (run.first_order == 0) {
        result.pred[p].push_back({-1, -1});
        continue;
      }
      auto it = by_last.find({run.segment, run.first_order - 1});
      MMSP_CHECK(it != by_last.end(), "gated DeltaNet: token ", run.first_order - 1, " of segment ", run.segment,
                 " is on no ring rank (the layouts must cover every segment from its start)");
      result.pred[p].push_back(it->second);
    }
  }
  return result;
}

int64_t RingRuns::max_runs() const {
  int64_t m = 0;
  for (const auto& r : runs) m = std::max<int64_t>(m, static_cast<int64_t>(r.size()));
  return m;
}

namespace {

int ring_size(const dist::GroupPtr& ring) { return ring ? ring->size() : 1; }
int ring_rank(const dist::GroupPtr& ring) { return ring ? ring->rank() : 0; }

std::vector<int64_t> run_counts(const RingRuns& runs, int64_t per_run) {
  std::vector<int64_t> counts;
  for (const auto& r : runs.runs) counts.push_back(static_cast<int64_t>(r.size()) * per_run);
  return counts;
}

// Tail row i of a run holds its token of order last − (W−2) + i (T: the zero row, before
// its start).
std::vector<int64_t> halo_rows_of(const std::vector<TokenRun>& mine, int64_t halo, int64_t T) {
  std::vector<int64_t> rows;
  for (const TokenRun& run : mine)
    for (int64_t i = 0; i < halo; ++i) {
      const int64_t pos = run.length - halo + i;
      rows.push_back(pos >= 0 ? run.begin + pos : T);
    }
  return rows;
}

// [T, W]: the row of ext = [x (T rows) | every rank's run tails ((W−1) rows per run) |
// one zero row] that tap j of token t reads.
std::vector<int64_t> conv_taps_of(const RingRuns& runs, int me, int64_t T, int64_t W,
                                  const std::vector<int64_t>& tail_offset, int64_t zero_row) {
  const int R = static_cast<int>(runs.runs.size());
  const int64_t halo = W - 1;
  const std::vector<TokenRun>& mine = runs.runs[me];
  std::vector<int64_t> index(T * W, zero_row);
  for (size_t j = 0; j < mine.size(); ++j) {
    const TokenRun& run = mine[j];
    for (int64_t i = 0; i < run.length; ++i) {
      const int64_t order = run.first_order + i;
      for (int64_t lag = 0; lag < W; ++lag) {
        const int64_t want = order - lag;
        int64_t& slot = index[(run.begin + i) * W + (W - 1 - lag)];
        if (want < 0) continue;  // before the segment: zero
        if (want >= run.first_order) {
          slot = run.begin + i - lag;
          continue;
        }
        MMSP_CHECK(R > 1, "gated_delta_conv: a run starts at order ", run.first_order, " of segment ", run.segment,
                   " but there is no ring to bring its context from");
        std::pair<int, int> node = runs.pred[me][j];
        while (want < runs.runs[node.first][node.second].first_order) node = runs.pred[node.first][node.second];
        const TokenRun& src = runs.runs[node.first][node.second];
        slot = tail_offset[node.first] + node.second * halo + (halo - 1) - (src.last_order() - want);
      }
    }
  }
  return index;
}

at::Tensor long_tensor(const std::vector<int64_t>& values, const at::Device& device) {
  return at::tensor(at::ArrayRef<int64_t>(values), at::kLong).to(device);
}

// pre[t] = Σ_j weight[:, j] ⊙ ext[taps[t, j]], one tap at a time. Gathering all taps as
// one [T, W, Ch] tensor and multiplying would keep 2·W copies of the input between the
// forward and the backward (800 MB for a 32k-token share of 4 Qwen3.5 heads in bf16);
// this keeps ext and regathers a tap at a time in the backward. Sums in fp32 for 16-bit
// inputs, as one reduction over the taps would.
//   ext [rows, Ch], weight [Ch, W], taps int64 [T, W] -> pre [T, Ch]
struct DepthwiseTaps : torch::autograd::Function<DepthwiseTaps> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& ext, const at::Tensor& weight,
                            const at::Tensor& taps) {
    ctx->save_for_backward({ext, weight, taps});
    const at::ScalarType wide = c10::elementSize(ext.scalar_type()) < 4 ? at::kFloat : ext.scalar_type();
    at::Tensor pre = at::zeros({taps.size(0), ext.size(1)}, ext.options().dtype(wide));
    for (int64_t j = 0; j < taps.size(1); ++j)
      pre.add_(ext.index_select(0, taps.select(1, j)).to(wide) * weight.select(1, j).to(wide));
    return pre.to(ext.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &ext = saved[0], &weight = saved[1], &taps = saved[2];
    const at::ScalarType wide = c10::elementSize(ext.scalar_type()) < 4 ? at::kFloat : ext.scalar_type();
    const at::Tensor d_pre = grads[0].to(wide);  // [T, Ch]
    at::Tensor d_ext = at::zeros(ext.sizes(), ext.options().dtype(wide));
    at::Tensor d_weight = at::empty(weight.sizes(), weight.options().dtype(wide));
    for (int64_t j = 0; j < taps.size(1); ++j) {
      const at::Tensor rows = taps.select(1, j);
      d_weight.select(1, j).copy_((d_pre * ext.index_select(0, rows).to(wide)).sum(0));
      d_ext.index_add_(0, rows, d_pre * weight.select(1, j).to(wide));
    }
    return {d_ext.to(ext.scalar_type()), d_weight.to(weight.scalar_type()), at::Tensor()};
  }
};

}  // namespace

RingRunIndex RingRunIndex::make(const std::vector<TokenLayout>& shares, int ring_rank, int64_t conv_kernel,
                                int64_t chunk, const at::Device& device) {
  const int R = static_cast<int>(shares.size());
  MMSP_CHECK(ring_rank >= 0 && ring_rank < R, "gated DeltaNet: ring rank ", ring_rank, " of ", R, " ring shares");
  MMSP_CHECK(conv_kernel > 0, "gated DeltaNet: conv kernel must be > 0, got ", conv_kernel);
  RingRunIndex index;
  index.runs = RingRuns::make(shares);
  index.ring_rank = ring_rank;
  index.conv_kernel = conv_kernel;
  const int64_t T = shares[ring_rank].size(), W = conv_kernel, halo = W - 1;
  index.tokens = T;
  const std::vector<TokenRun>& mine = index.runs.runs[ring_rank];

  std::vector<int64_t> tail_offset(R, T);  // first ext row of rank p's tails
  for (int p = 1; p < R; ++p)
    tail_offset[p] = tail_offset[p - 1] + static_cast<int64_t>(index.runs.runs[p - 1].size()) * halo;
  const bool exchange = R > 1 && halo > 0;
  const int64_t zero_row =
      exchange ? tail_offset[R - 1] + static_cast<int64_t>(index.runs.runs[R - 1].size()) * halo : T;
  if (exchange) index.halo_rows = long_tensor(halo_rows_of(mine, halo, T), device);
  index.conv_taps = long_tensor(conv_taps_of(index.runs, ring_rank, T, W, tail_offset, zero_row), device);
  index.conv_rows = zero_row + 1;

  index.chunks = RunChunks::make(mine, T, chunk, device);
  index.first_state_row.assign(R, 0);
  for (int p = 1; p < R; ++p)
    index.first_state_row[p] = index.first_state_row[p - 1] + static_cast<int64_t>(index.runs.runs[p - 1].size());
  return index;
}

at::Tensor gated_delta_conv(const at::Tensor& x, const at::Tensor& weight, const RingRunIndex& index,
                            const dist::GroupPtr& ring) {
  const int R = ring_size(ring);
  MMSP_CHECK(static_cast<int>(index.runs.runs.size()) == R && index.ring_rank == ring_rank(ring),
             "gated_delta_conv: the index was planned for ring rank ", index.ring_rank, " of ", index.runs.runs.size(),
             ", but this is ring rank ", ring_rank(ring), " of ", R);
  MMSP_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.size(0) == x.size(1),
             "gated_delta_conv: x [T, Ch] and weight [Ch, W] expected, got ", x.sizes(), " and ", weight.sizes());
  const int64_t T = x.size(0), W = weight.size(1), halo = W - 1;
  MMSP_CHECK(T == index.tokens && W == index.conv_kernel, "gated_delta_conv: the index was planned for ", index.tokens,
             " tokens and a kernel of ", index.conv_kernel, ", got x ", x.sizes(), " and weight ", weight.sizes());

  // ext = [x | every rank's run tails | one zero row], read by the planned taps
  std::vector<at::Tensor> parts{x};
  if (index.halo_rows.defined()) {
    at::Tensor padded = at::cat({x, at::zeros({1, x.size(1)}, x.options())}, 0);
    parts.push_back(dist::all_gather_v(padded.index_select(0, index.halo_rows), run_counts(index.runs, halo), ring));
  }
  parts.push_back(at::zeros({1, x.size(1)}, x.options()));
  at::Tensor ext = at::cat(parts, 0);
  MMSP_ASSERT(ext.size(0) == index.conv_rows);
  return at::silu(DepthwiseTaps::apply(ext, weight, index.conv_taps.view({T, W})));
}

at::Tensor gated_delta_ring_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                 const at::Tensor& beta, const RingRunIndex& index, const dist::GroupPtr& ring) {
  const int R = ring_size(ring), me = ring_rank(ring);
  MMSP_CHECK(static_cast<int>(index.runs.runs.size()) == R && index.ring_rank == me,
             "gated_delta_ring_rule: the index was planned for ring rank ", index.ring_rank, " of ",
             index.runs.runs.size(), ", but this is ring rank ", me, " of ", R);
  const RingRuns& runs = index.runs;
  const std::vector<TokenRun>& mine = runs.runs[me];
  if (R == 1) return gated_delta_rule(q, k, v, g, beta, index.chunks, {}, /*transitions=*/false).out;
  GatedDeltaResult local = gated_delta_rule(q, k, v, g, beta, index.chunks, {}, /*transitions=*/true);
  const int64_t K = q.size(2), V = v.size(2);
  // [runs, H, K, K + V]: (transition | final state from zero), fp32 for 16-bit inputs
  at::Tensor packed = at::cat({local.transition, local.final}, -1);
  at::Tensor all = dist::all_gather_v(packed, run_counts(runs, 1), ring);
  const std::vector<int64_t>& first_row = index.first_state_row;

  // S0 of a run, walking back to its segment start (chains are at most 2R runs long).
  std::map<std::pair<int, int>, at::Tensor> memo;
  std::function<at::Tensor(std::pair<int, int>)> initial = [&](std::pair<int, int> node) -> at::Tensor {
    const std::pair<int, int> pred = runs.pred[node.first][node.second];
    if (pred.first < 0) return at::Tensor();  // zero
    auto it = memo.find(node);
    if (it != memo.end()) return it->second;
    at::Tensor row = all[first_row[pred.first] + pred.second];  // [H, K, K + V]
    at::Tensor after = row.narrow(-1, K, V);
    at::Tensor s0 = initial(pred);
    if (s0.defined()) after = after + at::matmul(row.narrow(-1, 0, K), s0);
    memo[node] = after;
    return after;
  };

  // Every rank must take part in the backward all-gather, also one whose runs all
  // start their segments: tie the gathered states into its output (adds zero).
  std::vector<at::Tensor> pieces;  // out in token order, corrected run by run
  at::Tensor out = local.out + (all.sum() * 0).to(local.out.scalar_type());
  int64_t done = 0;
  const int64_t T = q.size(0);
  for (size_t j = 0; j < mine.size(); ++j) {
    const TokenRun& run = mine[j];
    at::Tensor s0 = initial({me, static_cast<int>(j)});
    if (!s0.defined()) continue;
    if (run.begin > done) pieces.push_back(out.narrow(0, done, run.begin - done));
    at::Tensor qe = local.q_eff.narrow(0, run.begin, run.length).transpose(0, 1);  // [H, n, K]
    at::Tensor fix = at::matmul(qe, s0).transpose(0, 1);                           // [n, H, V]
    pieces.push_back(out.narrow(0, run.begin, run.length) + fix.to(local.out.scalar_type()));
    done = run.begin + run.length;
  }
  if (done == 0) return out;
  if (done < T) pieces.push_back(out.narrow(0, done, T - done));
  return at::cat(pieces, 0);
}

int64_t gated_delta_ring_conv_bytes(int ring, int64_t max_runs, int64_t kernel, int64_t channels,
                                    int64_t element_size) {
  return (ring - 1) * max_runs * (kernel - 1) * channels * element_size;
}

int64_t gated_delta_ring_state_bytes(int ring, int64_t max_runs, int64_t heads, int64_t key_dim, int64_t value_dim,
                                     int64_t state_element_size) {
  return (ring - 1) * max_runs * heads * key_dim * (key_dim + value_dim) * state_element_size;
}

}  // namespace mmsp::attention
