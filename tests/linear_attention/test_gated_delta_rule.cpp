// The chunked gated delta rule against the token-by-token recurrence on one process
// (fp64, long packed sequences, segments shorter than a chunk, runs that start from a
// given state), its group-wise recomputing backward against plain autograd, and the
// bytes its graph holds between forward and backward.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <iostream>
#include <random>

#include "gated_delta_reference.h"
#include "mmsp/attention/linear/gated_delta_rule.h"
#include "mmsp/train/memory/memory_counter.h"
#include "packed_batch.h"

using namespace mmsp;
using namespace mmsp::attention;
using at::Tensor;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

// max |a − b| <= rtol·(1 + max |b|), reporting the first offending index.
void expect_close(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  Tensor diff = (got.to(at::kDouble) - want.to(at::kDouble)).abs();
  const double max_diff = diff.max().item<double>();
  const double tol = rtol * (1 + want.abs().max().item<double>());
  if (max_diff > tol) {
    const int64_t at_flat = diff.flatten().argmax().item<int64_t>();
    ADD_FAILURE() << what << ": max difference " << max_diff << " > " << tol << " at flat index " << at_flat << " (got "
                  << got.flatten()[at_flat].item<double>() << ", want " << want.flatten()[at_flat].item<double>()
                  << ")";
  }
}

struct Inputs {
  Tensor q, k, v, g, beta;
  std::vector<Tensor> all() const { return {q, k, v, g, beta}; }
};

Inputs random_inputs(int64_t T, int64_t H, int64_t K, int64_t V, at::TensorOptions options) {
  auto l2 = [](const Tensor& x) { return x / x.pow(2).sum(-1, true).sqrt(); };
  Inputs in;
  in.q = l2(at::randn({T, H, K}, kF64)).to(options).requires_grad_();
  in.k = l2(at::randn({T, H, K}, kF64)).to(options).requires_grad_();
  in.v = at::randn({T, H, V}, kF64).to(options).requires_grad_();
  in.g = (-0.2 * at::rand({T, H}, kF64)).to(options).requires_grad_();  // decay in (0.82, 1]
  in.beta = at::rand({T, H}, kF64).to(options).requires_grad_();
  return in;
}

std::vector<Tensor> grads_of(const Tensor& out, const Tensor& w, const Inputs& in) {
  return torch::autograd::grad({(out * w).sum()}, in.all());
}

}  // namespace

TEST(GatedDeltaRule, RunsSplitAtSegmentsOrderGapsAndPadding) {
  // segment 0: orders 0..2, padding, segment 1: 0..1, segment 1 again from order 5
  TokenLayout l{at::tensor({0, 0, 0, -1, 1, 1, 1}, at::kLong), at::tensor({0, 1, 2, 3, 0, 1, 5}, at::kLong)};
  std::vector<TokenRun> runs = token_runs(l);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].begin, 0);
  EXPECT_EQ(runs[0].length, 3);
  EXPECT_EQ(runs[1].begin, 4);
  EXPECT_EQ(runs[1].length, 2);
  EXPECT_EQ(runs[1].segment, 1);
  EXPECT_EQ(runs[2].begin, 6);
  EXPECT_EQ(runs[2].first_order, 5);
}

// Long packed sequences: several chunks, segments shorter than one chunk, one token,
// exactly one chunk, padding between segments. Output and the gradients of all inputs.
TEST(GatedDeltaRule, ChunkedEqualsRecurrenceOnLongPackedSequencesFp64) {
  at::manual_seed(7);
  const int64_t H = 3, K = 8, V = 6;
  TokenLayout layout = test::packed_layout({700, 37, 1, 64, 129, 300}, 4);
  const int64_t T = layout.size();
  Inputs in = random_inputs(T, H, K, V, kF64);
  Tensor w = at::randn({T, H, V}, kF64);
  Tensor ref = attention::gated_delta_recurrence(in.q, in.k, in.v, in.g, in.beta, layout);
  std::vector<Tensor> ref_grads = grads_of(ref, w, in);
  Tensor out = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, token_runs(layout)).out;
  std::vector<Tensor> got_grads = grads_of(out, w, in);
  expect_close(out, ref, 1e-9, "output");
  const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
  for (int i = 0; i < 5; ++i) expect_close(got_grads[i], ref_grads[i], 1e-9, names[i]);
  EXPECT_GT(ref.abs().max().item<double>(), 0.1);  // the comparison is not of zeros
}

// The backward recomputes groups of chunks from their saved start states and carries the
// state's gradient from group to group: with groups of 1, 2 and 3 chunks (runs that start
// and end mid-group, runs shorter than a chunk, given initial states, transitions) every
// gradient equals the one-group backward, which is plain autograd through the whole rule.
TEST(GatedDeltaRule, GroupedBackwardEqualsOneGroupOnEveryInputFp64) {
  at::manual_seed(10);
  const int64_t H = 2, K = 5, V = 4, C = 8;
  TokenLayout layout = test::packed_layout({50, 3, 17, 40}, 1);
  const int64_t T = layout.size();
  std::vector<TokenRun> runs = token_runs(layout);
  runs.push_back(runs.back());  // split the last segment: its second run starts mid-segment
  runs[runs.size() - 2].length = 21;
  runs.back().begin += 21, runs.back().length -= 21, runs.back().first_order += 21;
  Inputs in = random_inputs(T, H, K, V, kF64);
  Tensor init = at::randn({static_cast<int64_t>(runs.size()), H, K, V}, kF64).requires_grad_();
  Tensor w_out = at::randn({T, H, V}, kF64), w_q = at::randn({T, H, K}, kF64);
  Tensor w_final = at::randn({static_cast<int64_t>(runs.size()), H, K, V}, kF64);
  Tensor w_transition = at::randn({static_cast<int64_t>(runs.size()), H, K, K}, kF64);
  auto grads_with = [&](int64_t group) {
    GatedDeltaOptions opts;
    opts.chunk = C;
    opts.transitions = true;
    opts.group_chunks = group;
    GatedDeltaResult r = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, runs, init, opts);
    Tensor loss =
        (r.out * w_out).sum() + (r.q_eff * w_q).sum() + (r.final * w_final).sum() + (r.transition * w_transition).sum();
    std::vector<Tensor> inputs = in.all();
    inputs.push_back(init);
    std::vector<Tensor> got = torch::autograd::grad({loss}, inputs);
    got.push_back(r.out.detach());
    return got;
  };
  const std::vector<Tensor> whole = grads_with(1000);
  const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dinitial", "out"};
  for (int64_t group : {1, 2, 3}) {
    std::vector<Tensor> got = grads_with(group);
    for (size_t i = 0; i < whole.size(); ++i)
      expect_close(got[i], whole[i], 1e-12, std::string(names[i]) + " with groups of " + std::to_string(group));
  }
  EXPECT_GT(whole[5].abs().max().item<double>(), 0.1);  // the initial states' gradient is not zero
}

// Between forward and backward the rule's graph holds its output and the states
// entering each group of chunks, besides the inputs it was given (the caller's, not
// copies): not the ~30 [T, H, D]-sized intermediates of every chunk that plain autograd
// keeps, nor copies in chunk slots. The backward adds the inputs' gradients (3·T·H·D +
// 2·T·H, written to token order a group at a time) and one group's recomputed graph.
TEST(GatedDeltaRule, GraphHoldsItsOutputAndGroupStatesNotCopiesOrIntermediates) {
  at::manual_seed(11);
  const int64_t T = 8192, H = 4, D = 32, group = 4;
  Inputs in = random_inputs(T, H, D, D, kF64);
  TokenLayout layout = test::packed_layout({T}, 1);
  GatedDeltaOptions opts;
  opts.group_chunks = group;
  const int64_t bytes = T * H * D * 8;
  const int64_t groups = T / kGatedDeltaChunk / group, state_bytes = groups * H * D * D * 8;
  const int64_t group_tokens = group * kGatedDeltaChunk;
  train::MemoryCounter counter;
  Tensor out = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, token_runs(layout), {}, opts).out;
  const int64_t held = counter.current_bytes();
  EXPECT_LE(held, bytes + state_bytes + (int64_t{1} << 20)) << "formula " << bytes + state_bytes;
  EXPECT_GE(held, bytes);  // the output: the count sees the graph
  counter.reset_peak();
  std::vector<Tensor> got = torch::autograd::grad({(out * out).sum()}, in.all());
  const int64_t backward_peak = counter.peak_bytes() - held;
  // the gradients, the loss's own (the output's gradient 2·out and the product's) and
  // one group's graph (under 64 values a token·head·dim, as plain autograd keeps)
  const int64_t gradients = (3 * T * H * D + 2 * T * H) * 8;
  const int64_t bound = gradients + 2 * bytes + 64 * group_tokens * H * D * 8;
  EXPECT_LE(backward_peak, bound) << "the backward's working set is more than the gradients and a group";
  std::cout << "[ held " << held << " B after the forward (formula " << bytes + state_bytes << "), backward peak +"
            << backward_peak << " B (bound " << bound << ") ]\n";
}

// A segment cut into runs that start from the previous run's final state gives the
// recurrence on the whole segment; the transition and q_eff are the maps that
// final state and output are of the initial state (what ring state passing uses).
TEST(GatedDeltaRule, RunsFromGivenStatesAndTheirTransitions) {
  at::manual_seed(8);
  const int64_t H = 2, K = 5, V = 7;
  const int64_t T = 150;
  TokenLayout whole = test::packed_layout({T}, 1);
  Inputs in = random_inputs(T, H, K, V, kF64);
  Tensor ref = attention::gated_delta_recurrence(in.q, in.k, in.v, in.g, in.beta, whole);
  // runs [0, 70), [70, 73), [73, 150)
  std::vector<TokenRun> runs{{0, 70, 0, 0}, {70, 3, 0, 70}, {73, 77, 0, 73}};
  GatedDeltaOptions opts;
  opts.transitions = true;
  GatedDeltaResult zero = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, runs, {}, opts);
  // fold the runs as a ring rank would
  Tensor s1 = zero.final[0];
  Tensor s2 = at::matmul(zero.transition[1], s1) + zero.final[1];
  Tensor init = at::stack({at::zeros_like(s1), s1, s2});
  GatedDeltaResult given = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, runs, init, opts);
  expect_close(given.out, ref, 1e-9, "output from given states");
  std::vector<Tensor> fixed;
  for (int r = 0; r < 3; ++r) {
    Tensor qe = zero.q_eff.narrow(0, runs[r].begin, runs[r].length).transpose(0, 1);
    fixed.push_back(zero.out.narrow(0, runs[r].begin, runs[r].length) + at::matmul(qe, init[r]).transpose(0, 1));
  }
  expect_close(at::cat(fixed), ref, 1e-9, "output corrected by q_eff");
  for (int r = 0; r < 3; ++r)
    expect_close(given.final[r], at::matmul(zero.transition[r], init[r]) + zero.final[r], 1e-9, "final = M S0 + F");
}

// 16-bit inputs are computed in fp32 (the state too) and returned in their type.
TEST(GatedDeltaRule, LowPrecisionComputesInFp32) {
  at::manual_seed(9);
  TokenLayout layout = test::packed_layout({90, 20}, 1);
  Inputs in = random_inputs(layout.size(), 2, 8, 8, kF64);
  Tensor ref = attention::gated_delta_recurrence(in.q, in.k, in.v, in.g, in.beta, layout);
  auto bf = [](const Tensor& t) { return t.detach().to(at::kBFloat16); };
  GatedDeltaOptions opts;
  opts.transitions = true;
  GatedDeltaResult r =
      gated_delta_rule(bf(in.q), bf(in.k), bf(in.v), bf(in.g), bf(in.beta), token_runs(layout), {}, opts);
  EXPECT_EQ(r.out.scalar_type(), at::kBFloat16);
  EXPECT_EQ(r.final.scalar_type(), at::kFloat);
  EXPECT_EQ(r.transition.scalar_type(), at::kFloat);
  expect_close(r.out, ref, 3e-2, "bf16 output");
}
