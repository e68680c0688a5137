// The cuDNN kernel's CPU side: its varlen plan (square causal pieces, since cuDNN's causal
// mask on packed sequences is top-left aligned) covers exactly the allowed pairs and runs
// exactly on ATen's CPU flash kernel; the THD offsets it would pass; its limits, each a
// refusal naming the value and the rule; the log-sum-exp forms of the LibTorch releases.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <random>

#include "mmsp/attention/kernels/cudnn_attention.h"
#include "mmsp/attention/local_attention.h"
#include "mmsp/attention/naive_attention.h"
#include "mmsp/core/check.h"
#include "packed_batch.h"

using namespace mmsp;
using namespace mmsp::attention;
using at::Tensor;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

TokenLayout layout(std::vector<int64_t> segment, std::vector<int64_t> order) {
  return {at::tensor(segment, at::kLong), at::tensor(order, at::kLong)};
}

// How many calls' pieces cover each (query, key) pair; a causal piece under square_only
// must be square (cuDNN's top-left mask), under bottom_right it is aligned at its last key.
Tensor coverage(const FusedPlan& plan, CausalAlignment alignment) {
  Tensor seen = at::zeros({plan.queries, plan.keys}, at::kInt);
  for (const VarlenCall& call : plan.calls) {
    std::vector<int> rows(static_cast<size_t>(plan.queries), 0);
    for (const VarlenPiece& p : call.pieces) {
      if (call.causal && alignment == CausalAlignment::square_only) { EXPECT_EQ(p.q_length, p.k_length); }
      for (int64_t i = 0; i < p.q_length; ++i) {
        EXPECT_EQ(rows[p.q_begin + i]++, 0) << "a query row twice in one call";
        const int64_t last = call.causal ? i + (p.k_length - p.q_length) : p.k_length - 1;
        seen.narrow(0, p.q_begin + i, 1).narrow(1, p.k_begin, last + 1).add_(1);
      }
    }
  }
  return seen;
}

// Random pairs of layouts: packed rows, zigzag ring shares against each other, and a slice
// of a segment against the whole (causal pieces with more keys than queries).
std::vector<std::pair<TokenLayout, TokenLayout>> layout_pairs(std::mt19937& rng) {
  std::vector<std::pair<TokenLayout, TokenLayout>> pairs;
  for (int trial = 0; trial < 8; ++trial) {
    const int R = 1 + trial % 3;
    const TokenLayout global = test::packed_layout(test::random_lengths(rng, 1 + trial % 4, 40), 2 * R);
    const auto slots = test::context_slots(global, R, 1, 0, 0, true);
    for (int p = 0; p < R; ++p) pairs.emplace_back(slots.shares[0], slots.shares[p]);
    pairs.emplace_back(global, global);
  }
  pairs.emplace_back(layout({0, 0, 0, 0}, {2, 3, 4, 5}), layout({0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 2, 3, 4, 5, 6, 7}));
  return pairs;
}

TEST(CudnnPlanTest, PiecesCoverEveryAllowedPairOnce) {
  std::mt19937 rng(23);
  for (const auto& [q, k] : layout_pairs(rng))
    for (bool causal : {true, false})
      for (auto alignment : {CausalAlignment::bottom_right, CausalAlignment::square_only}) {
        std::string why;
        auto plan = plan_fused(q, k, causal, at::kCPU, &why, 4096, alignment);
        ASSERT_TRUE(plan) << why;
        EXPECT_TRUE(coverage(*plan, alignment).equal(attention_mask(q, k, causal).to(at::kInt)))
            << "causal " << causal << " square_only " << (alignment == CausalAlignment::square_only);
      }
}

// Queries of orders 2..5 against keys 0..7 of one segment: FlashAttention's plan is one
// causal piece of 4 × 6; cuDNN's a full piece of the first 2 keys and a square causal one.
TEST(CudnnPlanTest, ThdOffsetsOfAWidePiece) {
  const TokenLayout q = layout({0, 0, 0, 0}, {2, 3, 4, 5});
  const TokenLayout k = layout({0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 2, 3, 4, 5, 6, 7});
  std::string why;
  auto flash = plan_fused(q, k, true, at::kCPU, &why);
  ASSERT_TRUE(flash) << why;
  ASSERT_EQ(flash->calls.size(), 1u);
  EXPECT_EQ(flash->calls[0].max_k, 6);
  auto cudnn = plan_cudnn(q, k, true, at::kCPU, 92600, &why);
  ASSERT_TRUE(cudnn) << why;
  ASSERT_EQ(cudnn->calls.size(), 2u);
  const VarlenCall& full = cudnn->calls[0];
  const VarlenCall& causal = cudnn->calls[1];
  EXPECT_FALSE(full.causal);
  EXPECT_TRUE(full.cum_q.equal(at::tensor({0, 4}, at::kInt)));
  EXPECT_TRUE(full.cum_k.equal(at::tensor({0, 2}, at::kInt)));
  EXPECT_TRUE(full.k_rows.equal(at::tensor({0, 1}, at::kLong)));
  EXPECT_TRUE(causal.causal);
  EXPECT_TRUE(causal.cum_q.equal(at::tensor({0, 4}, at::kInt)));
  EXPECT_TRUE(causal.cum_k.equal(causal.cum_q));  // square: cuDNN gets the same offsets for both
  EXPECT_TRUE(causal.k_rows.equal(at::tensor({2, 3, 4, 5}, at::kLong)));
  EXPECT_FALSE(causal.q_rows.defined());  // every query row, in order
}

// The square plan, run piece by piece on ATen's CPU flash kernel and merged by lse, is the
// attention itself: output, lse and every gradient against the naive reference (fp64).
TEST(CudnnPlanTest, SquarePlanIsExactOnTheCpuFlashKernel) {
  std::mt19937 rng(29);
  int trial = 0;
  for (const auto& [ql, kl] : layout_pairs(rng)) {
    for (bool causal : {true, false}) {
      at::manual_seed(++trial);
      const int64_t H = 4, Hkv = trial % 2 ? 2 : 1, D = 8;  // GQA: 2 and 4 query heads per K/V head
      Tensor q = at::randn({ql.size(), H, D}, kF64).requires_grad_();
      Tensor k = at::randn({kl.size(), Hkv, D}, kF64).requires_grad_();
      Tensor v = at::randn({kl.size(), Hkv, D}, kF64).requires_grad_();
      Tensor w = at::randn({ql.size(), H, D}, kF64);
      NaiveAttention ref = naive_attention(q, k, v, ql, kl, causal);
      (ref.out * w).sum().backward();
      std::string why;
      auto plan = plan_cudnn(ql, kl, causal, at::kCPU, 0, &why);
      ASSERT_TRUE(plan) << why;
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      PartialAttention r = fused_attention_forward(q.detach(), k.detach(), v.detach(), *plan, scale);
      const Tensor live = ref.lse.isfinite();
      EXPECT_TRUE(r.lse.isfinite().equal(live)) << "trial " << trial;
      EXPECT_LT((r.lse - ref.lse).masked_fill(live.logical_not(), 0).abs().max().item<double>(), 1e-12);
      EXPECT_LT((r.out - ref.out).abs().max().item<double>(), 1e-12) << "trial " << trial;
      AttentionGrads g = fused_attention_backward(w, q.detach(), k.detach(), v.detach(), r.out, r.lse, *plan, scale);
      EXPECT_LT((g.dq - q.grad()).abs().max().item<double>(), 1e-11) << "dq, trial " << trial;
      EXPECT_LT((g.dk - k.grad()).abs().max().item<double>(), 1e-11) << "dk, trial " << trial;
      EXPECT_LT((g.dv - v.grad()).abs().max().item<double>(), 1e-11) << "dv, trial " << trial;
    }
  }
}

TEST(CudnnLimitsTest, EachRefusalNamesTheValueAndTheRule) {
  CudnnFacts ok;
  ok.cuda = true, ok.device = "cuda:0", ok.dtype = at::kBFloat16, ok.head_dim = 128, ok.cudnn_version = 92600;
  ok.sm_major = 9;
  EXPECT_EQ(cudnn_refusal(ok), "");
  auto refused = [&](auto change) {
    CudnnFacts f = ok;
    change(f);
    return cudnn_refusal(f);
  };
  using ::testing::HasSubstr;
  EXPECT_THAT(refused([](CudnnFacts& f) { f.cuda = false, f.device = "cpu"; }),
              HasSubstr("cuDNN attention runs on CUDA tensors; these are on cpu"));
  EXPECT_THAT(refused([](CudnnFacts& f) { f.dtype = at::kFloat; }), HasSubstr("takes bf16/fp16, got Float"));
  EXPECT_THAT(refused([](CudnnFacts& f) { f.head_dim = 256; }), HasSubstr("multiples of 8 up to 128, got 256"));
  EXPECT_THAT(refused([](CudnnFacts& f) { f.head_dim = 100; }), HasSubstr("got 100"));
  EXPECT_THAT(refused([](CudnnFacts& f) { f.cudnn_version = 91700; }),
              HasSubstr("needs cuDNN >= 9.18.0, this LibTorch has 9.17.0"));
  EXPECT_THAT(refused([](CudnnFacts& f) { f.cudnn_version = 0; }), HasSubstr("this LibTorch has none"));
  EXPECT_THAT(refused([](CudnnFacts& f) { f.sm_major = 8; }),
              HasSubstr("SM90/SM100 GPUs (Hopper, Blackwell), this one is SM8x"));
  EXPECT_THAT(refused([](CudnnFacts& f) { f.deterministic = true; }), HasSubstr("not deterministic"));
  EXPECT_EQ(refused([](CudnnFacts& f) { f.dtype = at::kHalf, f.head_dim = 64, f.sm_major = 10; }), "");
}

// cuDNN before 9.24 is not validated for calls whose longest piece has at most 128 queries:
// the plan refuses (auto runs the next kernel), naming both; 9.24 on plans it.
TEST(CudnnLimitsTest, OldRuntimesRefuseShortCalls) {
  const TokenLayout packed = test::packed_layout({100, 60}, 1);
  std::string why;
  EXPECT_FALSE(plan_cudnn(packed, packed, true, at::kCPU, 91800, &why));
  EXPECT_THAT(why, ::testing::HasSubstr("longest piece has 100 queries; cuDNN 9.18.0 is validated for max_q <= 128 "
                                        "from 9.24.0 on"));
  EXPECT_TRUE(plan_cudnn(packed, packed, true, at::kCPU, 92400, &why));
  const TokenLayout long_row = test::packed_layout({300, 60}, 1);
  EXPECT_TRUE(plan_cudnn(long_row, long_row, true, at::kCPU, 91800, &why)) << why;
}

TEST(CudnnLseTest, BothReleasesFormsRoundTrip) {
  const Tensor rows = at::arange(12, at::kFloat).reshape({4, 3});  // [n 4, H 3]
  CudnnLse seen = CudnnLse::unknown;
  EXPECT_TRUE(cudnn_lse_rows(rows.t().contiguous(), 3, 4, &seen).equal(rows));
  EXPECT_EQ(seen, CudnnLse::heads_first);
  EXPECT_TRUE(cudnn_lse_for_backward(rows, seen).equal(rows.t()));
  EXPECT_TRUE(cudnn_lse_rows(rows.unsqueeze(-1), 3, 4, &seen).equal(rows));
  EXPECT_EQ(seen, CudnnLse::rows_first);
  EXPECT_TRUE(cudnn_lse_for_backward(rows, seen).equal(rows.unsqueeze(-1)));
  EXPECT_THROW(cudnn_lse_rows(at::zeros({4, 4}), 3, 4, &seen), Error);
}

// Pinned on the CPU, the kernel plans (pure host work) but serves nothing, saying why.
TEST(CudnnLimitsTest, PinnedOnTheCpuSaysWhyNot) {
  const TokenLayout l = test::packed_layout({6}, 1);
  AttentionOptions options;
  options.kernel = parse_attention_kernel("cudnn");
  try {
    kernel_in_use(*plan_kernel(l, l, options, at::kCPU), at::zeros({6, 2, 8}, at::kBFloat16));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the cudnn kernel was asked for, but cuDNN attention runs on CUDA "
                                               "tensors; these are on cpu"));
  }
}

}  // namespace
