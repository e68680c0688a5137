// The chunked gated delta rule; see gated_delta_rule.h. Per chunk of C tokens
// (cumulative log decay G, γ = exp(G), Γ[t,i] = exp(G_t − G_i) for i <= t), the
// token recurrence unrolls to
//   U = Ũ − W S0,  Ũ = L⁻¹(β⊙V),  W = L⁻¹((βγ)⊙K),  L = I + strict_tril(β_t Γ[t,i] k_tᵀk_i)
//   O = (QKᵀ⊙Γ) Ũ + Q' S0,          Q' = γ⊙Q − (QKᵀ⊙Γ) W
//   S_C = D S0 + B,                  D = γ_C I − K̂ᵀW,  B = K̂ᵀŨ,  K̂ = (γ_C/γ)⊙K
// so everything but the short chain S ← D S + B over chunks is batched.
#include "mmsp/attention/gated_delta_rule.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "mmsp/core/check.h"

namespace mmsp::attention {

RunChunks RunChunks::make(const std::vector<TokenRun>& runs, int64_t tokens, int64_t chunk,
                          const at::Device& device) {
  MMSP_CHECK(chunk > 0, "gated_delta_rule: chunk must be > 0, got ", chunk);
  RunChunks plan;
  plan.tokens = tokens;
  plan.chunk = chunk;
  plan.runs = static_cast<int64_t>(runs.size());
  std::vector<int64_t> slots;
  for (size_t r = 0; r < runs.size(); ++r) {
    MMSP_CHECK(runs[r].begin >= 0 && runs[r].length > 0 && runs[r].begin + runs[r].length <= tokens,
               "gated_delta_rule: run ", r, " [", runs[r].begin, ", ", runs[r].begin + runs[r].length,
               ") is not inside the ", tokens, " tokens");
    const int64_t n = (runs[r].length + chunk - 1) / chunk;
    for (int64_t c = 0; c < n; ++c) {
      plan.chunk_run.push_back(static_cast<int64_t>(r));
      plan.run_start.push_back(c == 0);
      for (int64_t i = 0; i < chunk; ++i) {
        const int64_t pos = c * chunk + i;
        slots.push_back(pos < runs[r].length ? runs[r].begin + pos : tokens);
      }
    }
  }
  plan.chunks = static_cast<int64_t>(plan.chunk_run.size());
  std::vector<int64_t> token_slot(tokens, plan.chunks * chunk);
  for (size_t s = 0; s < slots.size(); ++s)
    if (slots[s] < tokens) token_slot[slots[s]] = static_cast<int64_t>(s);
  plan.token_slot = at::tensor(at::ArrayRef<int64_t>(token_slot), at::kLong).to(device);
  plan.slot_token = at::tensor(at::ArrayRef<int64_t>(slots), at::kLong).to(device);
  return plan;
}

std::vector<TokenRun> token_runs(const TokenLayout& layout) {
  layout.check("token_runs");
  std::vector<TokenRun> runs;
  const int64_t T = layout.size();
  const at::Tensor segment = layout.segment.contiguous(), order = layout.order.contiguous();
  const int64_t* seg = segment.data_ptr<int64_t>();
  const int64_t* ord = order.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (seg[t] < 0) continue;
    if (!runs.empty()) {
      TokenRun& last = runs.back();
      if (last.begin + last.length == t && last.segment == seg[t] && last.last_order() + 1 == ord[t]) {
        ++last.length;
        continue;
      }
    }
    runs.push_back({t, 1, seg[t], ord[t]});
  }
  return runs;
}

namespace {

// x [T, H, ...] -> [N, H, C, ...] in chunk order, zero rows for the padding slots.
at::Tensor to_chunks(const at::Tensor& x, const RunChunks& plan, int64_t C) {
  at::Tensor padded = at::cat({x, at::zeros_like(x.narrow(0, 0, 1))}, 0);
  at::Tensor rows = padded.index_select(0, plan.slot_token.to(x.device()));
  std::vector<int64_t> shape{plan.chunks, C};
  for (int64_t d = 1; d < x.dim(); ++d) shape.push_back(x.size(d));
  return rows.reshape(shape).transpose(1, 2);
}

// Shapes of the rule's inputs (names the bad value).
void check_rule_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                       const at::Tensor& beta, int64_t n_runs, const at::Tensor& initial) {
  MMSP_CHECK(q.dim() == 3 && k.sizes() == q.sizes(), "gated_delta_rule: q and k must be [T, H, K], got ",
             q.sizes(), " and ", k.sizes());
  const int64_t T = q.size(0), H = q.size(1), K = q.size(2);
  MMSP_CHECK(v.dim() == 3 && v.size(0) == T && v.size(1) == H, "gated_delta_rule: v must be [T, H, V] with T=",
             T, ", H=", H, ", got ", v.sizes());
  const int64_t V = v.size(2);
  MMSP_CHECK(g.sizes() == at::IntArrayRef({T, H}) && beta.sizes() == g.sizes(),
             "gated_delta_rule: g and beta must be [T, H] = [", T, ", ", H, "], got ", g.sizes(), " and ",
             beta.sizes());
  MMSP_CHECK(!initial.defined() || initial.sizes() == at::IntArrayRef({n_runs, H, K, V}),
             "gated_delta_rule: initial state must be [runs, H, K, V] = [", n_runs, ", ", H, ", ", K, ", ", V,
             "], got ", initial.sizes());
}

// No runs: nothing to compute, but the results stay in the inputs' graph (with zero
// weight): the backward collectives upstream must run on this rank as on every other.
GatedDeltaResult result_without_runs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& g, const at::Tensor& beta, at::ScalarType type) {
  const int64_t T = q.size(0), H = q.size(1), K = q.size(2), V = v.size(2);
  const auto opts = q.options().dtype(type);
  const at::Tensor anchor = (q.sum() + k.sum() + v.sum() + g.sum() + beta.sum()).to(type) * 0;
  GatedDeltaResult result;
  result.out = at::zeros({T, H, V}, q.options()) + anchor.to(q.scalar_type());
  result.final = at::zeros({0, H, K, V}, opts) + anchor;
  result.transition = at::zeros({0, H, K, K}, opts) + anchor;
  result.q_eff = at::zeros({T, H, K}, opts) + anchor;
  return result;
}

// What each chunk contributes on its own, every chunk at once: its outputs from inside
// the chunk, the map from its start state to its outputs (Q'), and its state update
// S_end = D S_start + B.
struct ChunkTerms {
  at::Tensor o_intra;  // [N, H, C, V]
  at::Tensor q_state;  // Q' [N, H, C, K]
  at::Tensor B;        // [N, H, K, V]
  at::Tensor D;        // [N, H, K, K]
};

// Q, Kc, Vc [N, H, C, ·] (Q scaled), Gc [N, H, C] cumulated, Bc [N, H, C]. In groups of
// chunks so that the [·, H, C, C] intermediates stay cache-sized (one pass over 64k
// tokens would not).
ChunkTerms intra_chunk_terms(const at::Tensor& Q, const at::Tensor& Kc, const at::Tensor& Vc, const at::Tensor& Gc,
                             const at::Tensor& Bc) {
  const int64_t N = Q.size(0), H = Q.size(1), C = Q.size(2), K = Q.size(3), V = Vc.size(3);
  const auto opts = Q.options();
  const at::Tensor incl = at::ones({C, C}, opts.dtype(at::kBool)).tril();  // i <= t
  const at::Tensor strict = at::ones({C, C}, opts.dtype(at::kBool)).tril(-1);
  const at::Tensor eye_c = at::eye(C, opts), eye_k = at::eye(K, opts);
  std::vector<at::Tensor> o_parts, q_parts, b_parts, d_parts;
  const int64_t group = std::max<int64_t>(1, (int64_t{1} << 18) / (H * C * C));
  for (int64_t c0 = 0; c0 < N; c0 += group) {
    const int64_t n = std::min(group, N - c0);
    at::Tensor Qg = Q.narrow(0, c0, n), Kg = Kc.narrow(0, c0, n), Vg = Vc.narrow(0, c0, n);
    at::Tensor Gg = Gc.narrow(0, c0, n), Bg = Bc.narrow(0, c0, n);
    at::Tensor diff = Gg.unsqueeze(-1) - Gg.unsqueeze(-2);  // [n, H, C, C]: G_t − G_i
    at::Tensor gamma_ti = diff.masked_fill(incl.logical_not(), -INFINITY).exp();
    at::Tensor gamma = Gg.exp();  // [n, H, C]
    at::Tensor kk = at::matmul(Kg, Kg.transpose(-1, -2));
    at::Tensor L = (Bg.unsqueeze(-1) * gamma_ti * kk).masked_fill(strict.logical_not(), 0) + eye_c;
    at::Tensor rhs = at::cat({Bg.unsqueeze(-1) * Vg, (Bg * gamma).unsqueeze(-1) * Kg}, -1);
    at::Tensor sol = at::linalg_solve_triangular(L, rhs, /*upper=*/false, /*left=*/true,
                                                 /*unitriangular=*/true);
    at::Tensor Ut = sol.narrow(-1, 0, V);  // Ũ [n, H, C, V]
    at::Tensor W = sol.narrow(-1, V, K);   // [n, H, C, K]
    at::Tensor qk = at::matmul(Qg, Kg.transpose(-1, -2)) * gamma_ti;       // [n, H, C, C]
    o_parts.push_back(at::matmul(qk, Ut));                                  // [n, H, C, V]
    q_parts.push_back(gamma.unsqueeze(-1) * Qg - at::matmul(qk, W));        // Q' [n, H, C, K]
    at::Tensor g_last = Gg.narrow(-1, C - 1, 1);                            // [n, H, 1]
    at::Tensor k_hat_t = ((g_last - Gg).exp().unsqueeze(-1) * Kg).transpose(-1, -2);  // K̂ᵀ [n, H, K, C]
    b_parts.push_back(at::matmul(k_hat_t, Ut));                                        // [n, H, K, V]
    d_parts.push_back(g_last.exp().unsqueeze(-1) * eye_k - at::matmul(k_hat_t, W));   // [n, H, K, K]
  }
  return {at::cat(o_parts), at::cat(q_parts), at::cat(b_parts), at::cat(d_parts)};
}

// Each chunk's start state and each run's final state, chained over the chunks.
struct ChunkStates {
  at::Tensor start;  // [N, H, K, width]
  at::Tensor final;  // [runs, H, K, width]
};

// With transitions the state carries [S | X] (width V + K): X starts at I and follows
// S's homogeneous part, so X at a chunk is the map from the run's initial state to the
// chunk's start state. Without, width V.
ChunkStates chain_states(const ChunkTerms& terms, const RunChunks& plan, int64_t n_runs, const at::Tensor& initial,
                         bool transitions) {
  const int64_t N = terms.B.size(0), H = terms.B.size(1), K = terms.B.size(2), V = terms.B.size(3);
  const auto opts = terms.B.options();
  at::Tensor add = transitions ? at::cat({terms.B, at::zeros({N, H, K, K}, opts)}, -1) : terms.B;
  at::Tensor start_x = at::eye(K, opts).expand({H, K, K});
  // unbind once: indexing D[c] in the loop would make autograd write a full-size
  // zero gradient per chunk (quadratic in the chunk count)
  const std::vector<at::Tensor> Ds = terms.D.unbind(0), adds = add.unbind(0);
  std::vector<at::Tensor> starts, finals(n_runs);
  at::Tensor state;
  for (int64_t c = 0; c < N; ++c) {
    const int64_t r = plan.chunk_run[c];
    if (plan.run_start[c]) {
      at::Tensor s0 = initial.defined() ? initial[r].to(opts.dtype()) : at::zeros({H, K, V}, opts);
      state = transitions ? at::cat({s0, start_x}, -1) : s0;
    }
    starts.push_back(state);
    state = at::matmul(Ds[c], state) + adds[c];
    if (c + 1 == N || plan.run_start[c + 1]) finals[r] = state;
  }
  return {at::stack(starts), at::stack(finals)};
}

// x [N, H, C, width] back from chunk slots to tokens [T, H, width]: slot s of the
// flattened chunks holds token slot_token[s]; padding slots are dropped.
at::Tensor from_chunks(const at::Tensor& x, const RunChunks& plan) {
  const int64_t N = x.size(0), H = x.size(1), C = x.size(2), width = x.size(3);
  at::Tensor rows = x.transpose(1, 2).reshape({N * C, H, width});
  rows = at::cat({rows, at::zeros({1, H, width}, rows.options())}, 0);
  return rows.index_select(0, plan.token_slot.to(rows.device()));
}

}  // namespace

GatedDeltaResult gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& g, const at::Tensor& beta,
                                  const std::vector<TokenRun>& runs, const at::Tensor& initial,
                                  const GatedDeltaOptions& options) {
  check_rule_inputs(q, k, v, g, beta, static_cast<int64_t>(runs.size()), initial);
  return gated_delta_rule(q, k, v, g, beta, RunChunks::make(runs, q.size(0), options.chunk, q.device()), initial,
                          options.transitions);
}

GatedDeltaResult gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& g, const at::Tensor& beta, const RunChunks& plan,
                                  const at::Tensor& initial, bool transitions) {
  const int64_t n_runs = plan.runs;
  check_rule_inputs(q, k, v, g, beta, n_runs, initial);
  const int64_t T = q.size(0), K = q.size(2), V = v.size(2), C = plan.chunk;
  MMSP_CHECK(plan.tokens == T, "gated_delta_rule: the chunk slots were planned for ", plan.tokens,
             " tokens, but q holds ", T);
  const at::ScalarType in_type = q.scalar_type();
  const at::ScalarType type = c10::elementSize(in_type) < 4 ? at::kFloat : in_type;
  if (n_runs == 0) return result_without_runs(q, k, v, g, beta, type);

  // [N, H, C, ·]
  const at::Tensor Q = to_chunks(q.to(type), plan, C) * (1.0 / std::sqrt(static_cast<double>(K)));
  const at::Tensor Gc = to_chunks(g.to(type), plan, C).cumsum(-1);  // [N, H, C]
  const ChunkTerms terms = intra_chunk_terms(Q, to_chunks(k.to(type), plan, C), to_chunks(v.to(type), plan, C), Gc,
                                             to_chunks(beta.to(type), plan, C));
  const ChunkStates states = chain_states(terms, plan, n_runs, initial, transitions);

  GatedDeltaResult result;
  const at::Tensor O = terms.o_intra + at::matmul(terms.q_state, states.start.narrow(-1, 0, V));  // [N, H, C, V]
  result.out = from_chunks(O, plan).to(in_type);
  result.final = states.final.narrow(-1, 0, V);
  if (transitions) {
    result.transition = states.final.narrow(-1, V, K);
    result.q_eff = from_chunks(at::matmul(terms.q_state, states.start.narrow(-1, V, K)), plan);  // [T, H, K]
  }
  return result;
}

}  // namespace mmsp::attention
