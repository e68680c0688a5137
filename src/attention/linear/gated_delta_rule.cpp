// The chunked gated delta rule; see gated_delta_rule.h. Per chunk of C tokens
// (cumulative log decay G, γ = exp(G), Γ[t,i] = exp(G_t − G_i) for i <= t), the
// token recurrence unrolls to
//   U = Ũ − W S0,  Ũ = L⁻¹(β⊙V),  W = L⁻¹((βγ)⊙K),  L = I + strict_tril(β_t Γ[t,i] k_tᵀk_i)
//   O = (QKᵀ⊙Γ) Ũ + Q' S0,          Q' = γ⊙Q − (QKᵀ⊙Γ) W
//   S_C = D S0 + B,                  D = γ_C I − K̂ᵀW,  B = K̂ᵀŨ,  K̂ = (γ_C/γ)⊙K
// so everything but the short chain S ← D S + B over chunks is batched.
#include "mmsp/attention/linear/gated_delta_rule.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "mmsp/core/check.h"

namespace mmsp::attention {

RunChunks RunChunks::make(const std::vector<TokenRun>& runs, int64_t tokens, int64_t chunk, const at::Device& device) {
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
  plan.slot_token = at::tensor(at::ArrayRef<int64_t>(slots), at::kLong).to(device);
  plan.slot_padding = plan.slot_token.ge(tokens);
  plan.slot_row = plan.slot_token.masked_fill(plan.slot_padding, 0);
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

// Shapes of the rule's inputs (names the bad value).
void check_rule_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                       const at::Tensor& beta, int64_t n_runs, const at::Tensor& initial) {
  MMSP_CHECK(q.dim() == 3 && k.sizes() == q.sizes(), "gated_delta_rule: q and k must be [T, H, K], got ", q.sizes(),
             " and ", k.sizes());
  const int64_t T = q.size(0), H = q.size(1), K = q.size(2);
  MMSP_CHECK(v.dim() == 3 && v.size(0) == T && v.size(1) == H, "gated_delta_rule: v must be [T, H, V] with T=", T,
             ", H=", H, ", got ", v.sizes());
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
GatedDeltaResult result_without_runs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                     const at::Tensor& beta, at::ScalarType type) {
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

// Q, Kc, Vc [n, H, C, ·] (Q scaled), Gc [n, H, C] cumulated, Bc [n, H, C]: one group of
// chunks at once (chain_group's caller keeps groups cache-sized).
ChunkTerms intra_chunk_terms(const at::Tensor& Qg, const at::Tensor& Kg, const at::Tensor& Vg, const at::Tensor& Gg,
                             const at::Tensor& Bg) {
  const int64_t C = Qg.size(2), K = Qg.size(3), V = Vg.size(3);
  const auto opts = Qg.options();
  const at::Tensor incl = at::ones({C, C}, opts.dtype(at::kBool)).tril();  // i <= t
  const at::Tensor strict = at::ones({C, C}, opts.dtype(at::kBool)).tril(-1);
  const at::Tensor eye_c = at::eye(C, opts), eye_k = at::eye(K, opts);
  at::Tensor diff = Gg.unsqueeze(-1) - Gg.unsqueeze(-2);  // [n, H, C, C]: G_t − G_i
  at::Tensor gamma_ti = diff.masked_fill(incl.logical_not(), -INFINITY).exp();
  at::Tensor gamma = Gg.exp();  // [n, H, C]
  at::Tensor kk = at::matmul(Kg, Kg.transpose(-1, -2));
  at::Tensor L = (Bg.unsqueeze(-1) * gamma_ti * kk).masked_fill(strict.logical_not(), 0) + eye_c;
  at::Tensor rhs = at::cat({Bg.unsqueeze(-1) * Vg, (Bg * gamma).unsqueeze(-1) * Kg}, -1);
  at::Tensor sol = at::linalg_solve_triangular(L, rhs, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  at::Tensor Ut = sol.narrow(-1, 0, V);                             // Ũ [n, H, C, V]
  at::Tensor W = sol.narrow(-1, V, K);                              // [n, H, C, K]
  at::Tensor qk = at::matmul(Qg, Kg.transpose(-1, -2)) * gamma_ti;  // [n, H, C, C]
  ChunkTerms terms;
  terms.o_intra = at::matmul(qk, Ut);                                               // [n, H, C, V]
  terms.q_state = gamma.unsqueeze(-1) * Qg - at::matmul(qk, W);                     // Q' [n, H, C, K]
  at::Tensor g_last = Gg.narrow(-1, C - 1, 1);                                      // [n, H, 1]
  at::Tensor k_hat_t = ((g_last - Gg).exp().unsqueeze(-1) * Kg).transpose(-1, -2);  // K̂ᵀ [n, H, K, C]
  terms.B = at::matmul(k_hat_t, Ut);                                                // [n, H, K, V]
  terms.D = g_last.exp().unsqueeze(-1) * eye_k - at::matmul(k_hat_t, W);            // [n, H, K, K]
  return terms;
}

// The chain over a group of chunks [c0, c0 + n) from the state entering it: each
// chunk's outputs, the state leaving it and the final states of the runs that end in
// it. With transitions the state carries [S | X] (width V + K): X starts at I and
// follows S's homogeneous part, so X at a chunk is the map from the run's initial state
// to the chunk's start state (q_eff = Q' X). Without, width V.
struct GroupChain {
  at::Tensor O;                                        // [n, H, C, V]
  at::Tensor q_eff;                                    // [n, H, C, K] (transitions)
  at::Tensor state;                                    // [H, K, width]: after chunk c0 + n − 1
  std::vector<std::pair<int64_t, at::Tensor>> finals;  // (run, state) of the runs that end in the group
};

// The chunk → run map of a plan, all the backward needs of it (it may outlive the plan).
struct ChunkRuns {
  std::vector<int64_t> run;  // [N]
  std::vector<bool> start;   // [N]: first chunk of its run
  bool continues_into(int64_t c) const { return c < static_cast<int64_t>(run.size()) && !start[c]; }
};

// Q, Kc, Vc, Gc, Bc: the group's chunks [n, H, C, ·]; state_in: the state entering the
// group, undefined when chunk c0 starts a run; initial: [runs, H, K, V] or undefined.
GroupChain chain_group(const at::Tensor& Q, const at::Tensor& Kc, const at::Tensor& Vc, const at::Tensor& Gc,
                       const at::Tensor& Bc, int64_t c0, const ChunkRuns& chunk_runs, at::Tensor state,
                       const at::Tensor& initial, bool transitions) {
  const ChunkTerms terms = intra_chunk_terms(Q, Kc, Vc, Gc, Bc);
  const int64_t n = Q.size(0), H = Q.size(1), K = Q.size(3), V = Vc.size(3);
  const auto opts = terms.B.options();
  at::Tensor add = transitions ? at::cat({terms.B, at::zeros({n, H, K, K}, opts)}, -1) : terms.B;
  // unbind once: indexing D[c] in the loop would make autograd write a full-size
  // zero gradient per chunk (quadratic in the chunk count)
  const std::vector<at::Tensor> Ds = terms.D.unbind(0), adds = add.unbind(0);
  GroupChain out;
  std::vector<at::Tensor> starts;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = c0 + i, r = chunk_runs.run[c];
    if (chunk_runs.start[c]) {
      at::Tensor s0 = initial.defined() ? initial[r] : at::zeros({H, K, V}, opts);
      state = transitions ? at::cat({s0, at::eye(K, opts).expand({H, K, K})}, -1) : s0;
    }
    starts.push_back(state);
    state = at::matmul(Ds[i], state) + adds[i];
    if (!chunk_runs.continues_into(c + 1)) out.finals.emplace_back(r, state);
  }
  const at::Tensor start = at::stack(starts);  // [n, H, K, width]
  out.O = terms.o_intra + at::matmul(terms.q_state, start.narrow(-1, 0, V));
  if (transitions) out.q_eff = at::matmul(terms.q_state, start.narrow(-1, V, K));
  out.state = state;
  return out;
}

// Chunks per group: the [group, H, C, C] intermediates stay cache-sized (one pass over
// 64k tokens would not), and the backward's working set is one group's graph.
int64_t chunks_per_group(int64_t H, int64_t C) { return std::max<int64_t>(1, (int64_t{1} << 18) / (H * C * C)); }

// How the chain runs: the chunk → run map, the runs, the chunks a group holds (what the
// backward recomputes at once), and whether it carries the transitions.
struct ChainPlan {
  ChunkRuns chunk_runs;
  int64_t runs = 0, group = 1;
  bool transitions = false;
};

// The planned indices of chunk slots [c0·C, (c0 + n)·C) (views: nothing computed per layer).
struct SlotRows {
  at::Tensor token;    // int64 [n·C]: the slot's token, or T for padding
  at::Tensor row;      // int64 [n·C]: the row the slot reads
  at::Tensor padding;  // bool [n·C]
};

SlotRows slot_rows(const RunChunks& plan, int64_t c0, int64_t n) {
  const int64_t first = c0 * plan.chunk, count = n * plan.chunk;
  return {plan.slot_token.narrow(0, first, count), plan.slot_row.narrow(0, first, count),
          plan.slot_padding.narrow(0, first, count)};
}

// x [T, H, ...] -> its rows of a group of n chunks, [n, H, C, ...] in dtype `type`, zero
// for the padding slots. Reads the group's rows only: no copy of the whole x.
at::Tensor gather_chunks(const at::Tensor& x, const SlotRows& rows, int64_t n, int64_t C, at::ScalarType type) {
  at::Tensor r = x.index_select(0, rows.row).to(type);
  std::vector<int64_t> mask_shape{n * C};
  for (int64_t d = 1; d < x.dim(); ++d) mask_shape.push_back(1);
  r = r.masked_fill(rows.padding.view(mask_shape), 0);
  std::vector<int64_t> shape{n, C};
  for (int64_t d = 1; d < x.dim(); ++d) shape.push_back(x.size(d));
  return r.reshape(shape).transpose(1, 2);
}

// The reverse: a group's chunk rows [n, H, C, ...] written to their tokens of x_padded
// [T + 1, H, ...] in its dtype (padding slots all land on row T, which the caller drops).
// Each token has one slot, so this is a copy, as exact as a sum into zeros.
void scatter_chunks(at::Tensor& x_padded, const at::Tensor& chunks, const SlotRows& rows) {
  const int64_t n = chunks.size(0), H = chunks.size(1), C = chunks.size(2);
  std::vector<int64_t> shape{n * C, H};
  for (int64_t d = 3; d < chunks.dim(); ++d) shape.push_back(chunks.size(d));
  x_padded.index_copy_(0, rows.token, chunks.transpose(1, 2).reshape(shape).to(x_padded.scalar_type()));
}

// A group of chunks' raw inputs in chunk slots and the compute dtype.
struct GroupInputs {
  at::Tensor q, k, v, g, beta;  // [n, H, C, ·], g and beta [n, H, C]
  std::vector<at::Tensor> all() const { return {q, k, v, g, beta}; }
};

GroupInputs gather_group(const std::vector<at::Tensor>& inputs, const SlotRows& rows, int64_t n, int64_t C,
                         at::ScalarType type) {
  std::vector<at::Tensor> x;
  for (const at::Tensor& input : inputs) x.push_back(gather_chunks(input, rows, n, C, type));
  return {x[0], x[1], x[2], x[3], x[4]};
}

// The chain over a group from its raw inputs: Q scaled by 1/√K, G cumulated over each chunk.
GroupChain chain_from_inputs(const GroupInputs& x, int64_t c0, const ChainPlan& plan, const at::Tensor& state_in,
                             const at::Tensor& initial) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(x.q.size(3)));
  return chain_group(x.q * scale, x.k, x.v, x.g.cumsum(-1), x.beta, c0, plan.chunk_runs, state_in, initial,
                     plan.transitions);
}

// The chunked rule as one autograd node over the token-order inputs, a group of chunks at
// a time: each group's rows are gathered into chunk slots in the compute dtype, chained
// from the state entering it, and its outputs written back to their tokens. Between
// forward and backward it keeps the inputs as they came (the caller's tensors, no copy),
// its outputs and the state entering each group; its backward gathers a group again,
// last group first, recomputes it from its entering state, backpropagates through it
// (carrying the state's gradient to the group before) and writes the gradients to their
// tokens. So no [T, H, ·] tensor in chunk slots or in the compute dtype exists at all
// (but q_eff's, with transitions): plain autograd would keep every chunk's intermediates,
// ~60 bytes per token·head·dim (2 GiB for a 32k-token layer of 4 heads of 128).
//   inputs:  q, k [T, H, K], v [T, H, V], g, beta [T, H], initial (0 or 1 tensors [runs, H, K, V])
//   outputs: out [T, H, V] in q's dtype, final [runs, H, K, width] and q_eff [T, H, K]
//            ([0, H, K] without transitions) in the compute dtype
struct ChunkedDeltaRule : torch::autograd::Function<ChunkedDeltaRule> {
  struct Plan : torch::CustomClassHolder {
    RunChunks chunks;
    ChainPlan chain;
    at::ScalarType type = at::kFloat;
  };

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& beta, at::TensorList initial,
                                                const c10::intrusive_ptr<Plan>& plan) {
    const int64_t T = q.size(0), H = q.size(1), K = q.size(2), V = v.size(2);
    const ChainPlan& chain = plan->chain;
    const int64_t N = plan->chunks.chunks, C = plan->chunks.chunk, width = chain.transitions ? V + K : V;
    const auto wide = q.options().dtype(plan->type);
    const at::Tensor init = initial.empty() ? at::Tensor() : initial[0];
    const std::vector<at::Tensor> inputs{q, k, v, g, beta};
    at::Tensor out = at::zeros({T + 1, H, V}, q.options());  // row T: the padding slots'
    at::Tensor q_eff = at::zeros({chain.transitions ? T + 1 : 1, H, K}, wide);
    at::Tensor final = at::zeros({chain.runs, H, K, width}, wide);
    std::vector<at::Tensor> entering;  // zeros at a run start
    at::Tensor state;
    for (int64_t c0 = 0; c0 < N; c0 += chain.group) {
      const int64_t n = std::min(chain.group, N - c0);
      const SlotRows rows = slot_rows(plan->chunks, c0, n);
      entering.push_back(state.defined() ? state : at::zeros({H, K, width}, wide));
      GroupChain gc = chain_from_inputs(gather_group(inputs, rows, n, C, plan->type), c0, chain, state, init);
      scatter_chunks(out, gc.O, rows);
      if (chain.transitions) scatter_chunks(q_eff, gc.q_eff, rows);
      for (const auto& [r, s] : gc.finals) final[r].copy_(s);
      state = chain.chunk_runs.continues_into(c0 + n) ? gc.state : at::Tensor();
    }
    std::vector<at::Tensor> saved{q, k, v, g, beta, at::stack(entering)};
    if (init.defined()) saved.push_back(init);
    ctx->save_for_backward(saved);
    ctx->saved_data["plan"] = c10::IValue::make_capsule(plan);
    return {out.narrow(0, 0, T), final, q_eff.narrow(0, 0, chain.transitions ? T : 0)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto plan = c10::static_intrusive_pointer_cast<Plan>(ctx->saved_data["plan"].toCapsule());
    const ChainPlan& chain = plan->chain;
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const std::vector<at::Tensor> inputs(saved.begin(), saved.begin() + 5);  // q, k, v, g, beta
    const at::Tensor& entering = saved[5];
    const bool has_initial = saved.size() > 6;
    const at::Tensor &d_out = grads[0], &d_final = grads[1], &d_q_eff = grads[2];
    const int64_t T = inputs[0].size(0), N = plan->chunks.chunks, C = plan->chunks.chunk;
    std::vector<at::Tensor> d;  // [T + 1, ...]: row T takes the padding slots'
    for (const at::Tensor& x : inputs) {
      std::vector<int64_t> shape = x.sizes().vec();
      shape[0] = T + 1;
      d.push_back(at::zeros(shape, x.options()));
    }
    at::Tensor d_initial = has_initial ? at::zeros_like(saved[6]) : at::Tensor();
    at::Tensor d_leaving;  // gradient of the state leaving the group (from the group after it)
    const int64_t groups = (N + chain.group - 1) / chain.group;
    for (int64_t gi = groups - 1; gi >= 0; --gi) {
      const int64_t c0 = gi * chain.group, n = std::min(chain.group, N - c0);
      const SlotRows rows = slot_rows(plan->chunks, c0, n);
      GroupInputs x = gather_group(inputs, rows, n, C, plan->type);
      std::vector<at::Tensor> leaves;
      for (at::Tensor* t : {&x.q, &x.k, &x.v, &x.g, &x.beta}) leaves.push_back(t->requires_grad_());
      const bool continued = chain.chunk_runs.continues_into(c0);  // the group starts mid-run
      at::Tensor state_in = continued ? entering[gi].detach().requires_grad_() : at::Tensor();
      at::Tensor init = has_initial ? saved[6].detach().requires_grad_() : at::Tensor();
      GroupChain gc;
      {
        at::AutoGradMode with_grad(true);
        gc = chain_from_inputs(x, c0, chain, state_in, init);
      }
      torch::autograd::variable_list outputs{gc.O}, grad_outputs{gather_chunks(d_out, rows, n, C, plan->type)};
      if (chain.transitions) {
        outputs.push_back(gc.q_eff);
        grad_outputs.push_back(gather_chunks(d_q_eff, rows, n, C, plan->type));
      }
      for (const auto& [r, s] : gc.finals) {
        outputs.push_back(s);
        grad_outputs.push_back(d_final[r]);
      }
      if (chain.chunk_runs.continues_into(c0 + n) && d_leaving.defined()) {  // the state goes on
        outputs.push_back(gc.state);
        grad_outputs.push_back(d_leaving);
      }
      if (continued) leaves.push_back(state_in);
      if (has_initial) leaves.push_back(init);
      const torch::autograd::variable_list got = torch::autograd::grad(outputs, leaves, grad_outputs,
                                                                       /*retain_graph=*/false,
                                                                       /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t i = 0; i < d.size(); ++i)
        if (got[i].defined()) scatter_chunks(d[i], got[i], rows);
      d_leaving = continued && got[5].defined() ? got[5] : at::Tensor();
      if (has_initial && got.back().defined()) d_initial += got.back();
    }
    torch::autograd::variable_list result;
    for (const at::Tensor& x : d) result.push_back(x.narrow(0, 0, T));
    if (has_initial) result.push_back(d_initial);
    result.emplace_back();  // the plan capsule
    return result;
  }
};

}  // namespace

GatedDeltaResult gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const at::Tensor& beta, const std::vector<TokenRun>& runs, const at::Tensor& initial,
                                  const GatedDeltaOptions& options) {
  check_rule_inputs(q, k, v, g, beta, static_cast<int64_t>(runs.size()), initial);
  return gated_delta_rule(q, k, v, g, beta, RunChunks::make(runs, q.size(0), options.chunk, q.device()), initial,
                          options.transitions, options.group_chunks);
}

GatedDeltaResult gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const at::Tensor& beta, const RunChunks& plan, const at::Tensor& initial,
                                  bool transitions, int64_t group_chunks) {
  const int64_t n_runs = plan.runs;
  check_rule_inputs(q, k, v, g, beta, n_runs, initial);
  const int64_t T = q.size(0), K = q.size(2), V = v.size(2), C = plan.chunk;
  MMSP_CHECK(plan.tokens == T, "gated_delta_rule: the chunk slots were planned for ", plan.tokens,
             " tokens, but q holds ", T);
  const at::ScalarType in_type = q.scalar_type();
  const at::ScalarType type = c10::elementSize(in_type) < 4 ? at::kFloat : in_type;
  if (n_runs == 0) return result_without_runs(q, k, v, g, beta, type);

  auto rule = c10::make_intrusive<ChunkedDeltaRule::Plan>();
  rule->chunks = plan;
  rule->type = type;
  rule->chain.chunk_runs = {plan.chunk_run, plan.run_start};
  rule->chain.runs = n_runs;
  rule->chain.group = group_chunks > 0 ? group_chunks : chunks_per_group(q.size(1), C);
  rule->chain.transitions = transitions;
  std::vector<at::Tensor> init;
  if (initial.defined()) init.push_back(initial.to(type));
  const torch::autograd::variable_list got = ChunkedDeltaRule::apply(q, k, v, g, beta, at::TensorList(init), rule);

  GatedDeltaResult result;
  result.out = got[0];  // [T, H, V]
  result.final = got[1].narrow(-1, 0, V);
  if (transitions) {
    result.transition = got[1].narrow(-1, V, K);
    result.q_eff = got[2];  // [T, H, K]
  }
  return result;
}

}  // namespace mmsp::attention
