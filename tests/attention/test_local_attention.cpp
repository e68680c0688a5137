// Single-process tests of the local kernel against the naive full-matrix attention:
// forward values, log-sum-exp and every input gradient (fp64), block skipping, LSE
// merging, bf16, and bad inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <random>

#include "mmsp/attention/kernels/fused_attention.h"
#include "mmsp/attention/local_attention.h"
#include "mmsp/attention/naive_attention.h"
#include "mmsp/attention/plan_layout.h"
#include "mmsp/core/check.h"
#include "packed_batch.h"

using namespace mmsp;
using namespace mmsp::attention;
using at::Tensor;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

double max_rel_diff(const Tensor& got, const Tensor& expected) {
  if (got.numel() == 0) return 0;
  Tensor finite = expected.isfinite();
  EXPECT_TRUE(got.isfinite().eq(finite).all().item<bool>()) << "infinities differ";
  Tensor e = expected.masked_fill(finite.logical_not(), 0), g = got.masked_fill(finite.logical_not(), 0);
  return ((g - e).abs().max() / (1 + e.abs().max())).item<double>();
}

// Shuffles a layout (the kernel must not assume any token order).
TokenLayout shuffled(const TokenLayout& l, std::mt19937& rng) {
  std::vector<int64_t> perm(l.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  Tensor index = at::tensor(at::ArrayRef<int64_t>(perm), at::kLong).clone();
  return {l.segment.index_select(0, index), l.order.index_select(0, index)};
}

struct KernelCase {
  bool causal;
  int64_t kv_heads;
  int64_t block_q, block_k;
  bool shuffle;
};

// Every kernel of the registry (a new one is tested here as it is added) on every case, where
// it serves CPU fp64 tensors (fused: ATen's CPU flash kernel, the same plan as CUDA's).
class LocalAttentionTest : public ::testing::TestWithParam<std::tuple<const LocalKernel*, KernelCase>> {};

TEST_P(LocalAttentionTest, MatchesNaiveForwardAndEveryGradient) {
  const auto& [kernel, c] = GetParam();
  std::string why_not;
  if (kernel->serves(at::zeros({1, 1, 8}, kF64), &why_not) == nullptr)
    GTEST_SKIP() << kernel->name() << " does not serve CPU fp64 tensors: " << why_not;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3; ++trial) {
    TokenLayout layout = test::packed_layout(test::random_lengths(rng, 4, 40), 6);
    TokenLayout ql = c.shuffle ? shuffled(layout, rng) : layout;
    const int64_t T = layout.size(), H = 4, D = 8;
    at::manual_seed(trial);
    Tensor q = at::randn({T, H, D}, kF64).requires_grad_();
    Tensor k = at::randn({T, c.kv_heads, D}, kF64).requires_grad_();
    Tensor v = at::randn({T, c.kv_heads, D}, kF64).requires_grad_();
    Tensor w = at::randn({T, H, D}, kF64);

    NaiveAttention ref = naive_attention(q, k, v, ql, layout, c.causal);
    (ref.out * w).sum().backward();
    Tensor dq = q.grad().clone(), dk = k.grad().clone(), dv = v.grad().clone();
    q.grad().zero_(), k.grad().zero_(), v.grad().zero_();

    AttentionOptions options;
    options.causal = c.causal;
    options.block_q = c.block_q;
    options.block_k = c.block_k;
    options.kernel = AttentionKernel{kernel};
    PartialAttention raw = local_attention_forward(q.detach(), k.detach(), v.detach(), ql, layout, options);
    EXPECT_LT(max_rel_diff(raw.lse, ref.lse.detach()), 1e-12) << "lse, trial " << trial;
    Tensor out = local_attention(q, k, v, ql, layout, options);
    (out * w).sum().backward();
    EXPECT_LT(max_rel_diff(out.detach(), ref.out.detach()), 1e-12) << "out, trial " << trial;
    EXPECT_LT(max_rel_diff(q.grad(), dq), 1e-11) << "dq, trial " << trial;
    EXPECT_LT(max_rel_diff(k.grad(), dk), 1e-11) << "dk, trial " << trial;
    EXPECT_LT(max_rel_diff(v.grad(), dv), 1e-11) << "dv, trial " << trial;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernel, LocalAttentionTest,
    ::testing::Combine(::testing::ValuesIn(local_kernels()),
                       ::testing::Values(KernelCase{true, 4, 256, 512, false}, KernelCase{true, 2, 5, 7, false},
                                         KernelCase{true, 1, 8, 16, true}, KernelCase{false, 2, 8, 8, false},
                                         KernelCase{false, 1, 16, 4, true}, KernelCase{true, 4, 16, 16, true})),
    [](const auto& info) {
      const LocalKernel* kernel = std::get<0>(info.param);
      const KernelCase& c = std::get<1>(info.param);
      return std::string(kernel->name()) + "_" + (c.causal ? "causal" : "bidirectional") + "_kv" +
             std::to_string(c.kv_heads) + "_bq" + std::to_string(c.block_q) + "_bk" + std::to_string(c.block_k) +
             (c.shuffle ? "_shuffled" : "");
    });

// A block is skipped only if the mask empties it, and marked full only if every
// pair in it is allowed.
TEST(BlockScheduleTest, SkipsExactlyTheEmptyBlocks) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const bool causal = trial % 2 == 0;
    TokenLayout k = test::packed_layout(test::random_lengths(rng, 1 + trial % 5, 50), 4);
    TokenLayout q = trial % 3 == 0 ? shuffled(k, rng) : k;
    const int64_t bq = 1 + trial % 9, bk = 2 + trial % 13;
    BlockSchedule schedule = BlockSchedule::make(q, k, causal, bq, bk);
    Tensor mask = attention_mask(q, k, causal);
    int64_t listed_pairs = 0;
    for (size_t qb = 0; qb < schedule.key_blocks.size(); ++qb) {
      const int64_t i = qb * bq, n = std::min(bq, q.size() - i);
      std::vector<bool> listed((k.size() + bk - 1) / bk, false);
      for (const KeyBlock& b : schedule.key_blocks[qb]) {
        Tensor block = mask.narrow(0, i, n).narrow(1, b.begin, b.end - b.begin);
        EXPECT_TRUE(block.any().item<bool>()) << "listed block is empty";
        if (b.full) { EXPECT_TRUE(block.all().item<bool>()) << "full block has masked pairs"; }
        listed[b.begin / bk] = true;
        listed_pairs += block.sum().item<int64_t>();
      }
      for (size_t kb = 0; kb < listed.size(); ++kb)
        if (!listed[kb]) {
          EXPECT_FALSE(
              mask.narrow(0, i, n).narrow(1, kb * bk, std::min<int64_t>(bk, k.size() - kb * bk)).any().item<bool>())
              << "skipped a block with allowed pairs";
        }
    }
    EXPECT_EQ(listed_pairs, mask.sum().item<int64_t>());
    EXPECT_EQ(allowed_pairs(q, k, causal), mask.sum().item<int64_t>());
  }
}

// Attention over two disjoint key sets, merged by LSE, equals attention over all.
TEST(MergePartialTest, KeySplitsMergeToTheWhole) {
  std::mt19937 rng(3);
  TokenLayout layout = test::packed_layout(test::random_lengths(rng, 3, 30), 4);
  const int64_t T = layout.size();
  at::manual_seed(1);
  Tensor q = at::randn({T, 4, 8}, kF64), k = at::randn({T, 2, 8}, kF64), v = at::randn({T, 2, 8}, kF64);
  PartialAttention whole = local_attention_forward(q, k, v, layout, layout, {});
  const int64_t cut = T / 3;  // queries past the cut see keys in both parts; early ones in one
  PartialAttention merged;
  merge_partial(merged, local_attention_forward(q, k.narrow(0, cut, T - cut), v.narrow(0, cut, T - cut), layout,
                                                layout.slice(cut, T - cut), {}));
  merge_partial(merged,
                local_attention_forward(q, k.narrow(0, 0, cut), v.narrow(0, 0, cut), layout, layout.slice(0, cut), {}));
  EXPECT_LT(max_rel_diff(merged.out, whole.out), 1e-13);
  EXPECT_LT(max_rel_diff(merged.lse, whole.lse), 1e-13);
}

TEST(LocalAttentionDtypeTest, Bf16AndFp32AccumulateInFp32) {
  std::mt19937 rng(5);
  TokenLayout layout = test::packed_layout(test::random_lengths(rng, 3, 60), 1);
  const int64_t T = layout.size();
  at::manual_seed(2);
  Tensor q = at::randn({T, 4, 16}, kF64), k = at::randn({T, 2, 16}, kF64), v = at::randn({T, 2, 16}, kF64);
  Tensor ref = local_attention_forward(q, k, v, layout, layout, {}).out;
  for (auto type : {at::kFloat, at::kBFloat16}) {
    Tensor qt = q.to(type).requires_grad_(), kt = k.to(type).requires_grad_(), vt = v.to(type).requires_grad_();
    PartialAttention r = local_attention_forward(qt.detach(), kt.detach(), vt.detach(), layout, layout, {});
    EXPECT_EQ(r.out.scalar_type(), type);
    EXPECT_EQ(r.lse.scalar_type(), at::kFloat);
    const double tol = type == at::kFloat ? 1e-5 : 3e-2;
    EXPECT_LT(max_rel_diff(r.out.to(at::kDouble), ref), tol) << type;
    Tensor out = local_attention(qt, kt, vt, layout, layout, {});
    out.sum().backward();
    EXPECT_EQ(qt.grad().scalar_type(), type);
    EXPECT_TRUE(qt.grad().isfinite().all().item<bool>());
  }
}

TEST(LocalAttentionErrorsTest, BadInputsNameTheValue) {
  TokenLayout l = test::packed_layout({8}, 1);
  Tensor q = at::zeros({8, 3, 4}, kF64), k = at::zeros({8, 2, 4}, kF64);
  try {
    local_attention_forward(q, k, k, l, l, {});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("query heads (3) must be a multiple of key/value heads (2)"));
  }
  Tensor q4 = at::zeros({8, 4, 4}, kF64);
  EXPECT_THROW(local_attention_forward(q4, k, k, test::packed_layout({7}, 1), l, {}), Error);
  EXPECT_THROW(local_attention_forward(q4.to(at::kLong), k.to(at::kLong), k.to(at::kLong), l, l, {}), Error);
  EXPECT_THROW(local_attention_forward(q4, k, at::zeros({8, 2, 5}, kF64), l, l, {}), Error);
}

// A packed row attending itself is one varlen call over its segments, read in place; a
// zigzag share's late chunk sees the early chunk fully and itself causally: two calls.
TEST(FusedPlanTest, PackedRowsAreOneCallAndZigzagSharesTwo) {
  const TokenLayout packed = test::packed_layout({5, 3, 8}, 4);  // 8 + 4 + 8 rows, padding after each
  std::string why;
  auto plan = plan_fused(packed, packed, true, at::kCPU, &why);
  ASSERT_TRUE(plan) << why;
  ASSERT_EQ(plan->calls.size(), 1u);
  const VarlenCall& call = plan->calls[0];
  EXPECT_TRUE(call.causal);
  EXPECT_TRUE(call.q_rows.defined());  // padding rows are left out
  EXPECT_TRUE(call.cum_q.equal(at::tensor({0, 5, 8, 16}, at::kInt)));
  EXPECT_EQ(call.max_q, 8);
  const TokenLayout exact = test::packed_layout({4, 8}, 4);
  auto in_place = plan_fused(exact, exact, false, at::kCPU, &why);
  ASSERT_TRUE(in_place);
  EXPECT_FALSE(in_place->calls[0].q_rows.defined());  // every row, in order: no gather
  EXPECT_FALSE(in_place->calls[0].causal);

  // One segment of 8 on 2 ring ranks, zigzag: rank 0 holds orders 0,1 and 6,7.
  const TokenLayout share{at::tensor({0, 0, 0, 0}, at::kLong), at::tensor({0, 1, 6, 7}, at::kLong)};
  auto zigzag = plan_fused(share, share, true, at::kCPU, &why);
  ASSERT_TRUE(zigzag);
  ASSERT_EQ(zigzag->calls.size(), 2u);
  EXPECT_TRUE(zigzag->calls[0].causal);   // each chunk with itself
  EXPECT_FALSE(zigzag->calls[1].causal);  // the late chunk with the early one
  EXPECT_EQ(zigzag->calls[0].pieces.size(), 2u);
  EXPECT_EQ(zigzag->calls[1].pieces.size(), 1u);

  const TokenLayout shuffled_layout{at::tensor({0, 1, 0, 1, 0, 1}, at::kLong),
                                    at::tensor({0, 0, 1, 1, 2, 2}, at::kLong)};
  EXPECT_FALSE(plan_fused(shuffled_layout, shuffled_layout, true, at::kCPU, &why, 4));
  EXPECT_THAT(why, ::testing::HasSubstr("more than 4 (query run, key run) pieces"));
}

// The registry: every entry is chosen by its name; auto is none of them; the blockwise
// kernel closes the table (auto's fallback, serving every tensor).
TEST(KernelRegistryTest, KernelChoiceIsNamedFromTheTable) {
  std::vector<std::string> names;
  for (const LocalKernel* k : local_kernels()) {
    names.push_back(k->name());
    EXPECT_EQ(parse_attention_kernel(k->name()).pinned, k);
    EXPECT_STREQ(attention_kernel_name(parse_attention_kernel(k->name())), k->name());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fused", "cudnn", "blockwise"}));
  EXPECT_TRUE(parse_attention_kernel("auto").automatic());
  EXPECT_STREQ(attention_kernel_name(parse_attention_kernel("auto")), "auto");
  try {
    parse_attention_kernel("flash");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("attention kernel 'flash' is not one of auto, fused, cudnn, blockwise"));
  }
  const TokenLayout l = test::packed_layout({6}, 1);
  const Tensor q = at::zeros({6, 2, 8}, kF64);
  AttentionOptions options;  // automatic: mmsp's kernel on the CPU
  EXPECT_STREQ(kernel_in_use(*plan_kernel(l, l, options, at::kCPU), q), "blockwise");
  options.kernel = parse_attention_kernel("fused");
  EXPECT_STREQ(kernel_in_use(*plan_kernel(l, l, options, at::kCPU), q), "cpu-flash");
  std::string why;
  const Tensor bad = at::zeros({6, 2, 8}, kF64).to(at::Device("meta"));
  EXPECT_EQ(fused_kernel_for(bad, &why), nullptr);
  EXPECT_THAT(why, ::testing::HasSubstr("no fused kernel for tensors on meta"));
}

// The plan's zigzag shard map gives the layouts docs/runtime.md#sharding-layout's rule gives.
TEST(PlanLayoutTest, RingSharesFollowTheZigzagRule) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 30; ++trial) {
    const int R = 1 + trial % 4, U = 1 + (trial / 4) % 3;
    std::vector<int64_t> lengths = test::random_lengths(rng, 1 + trial % 4, 30), ids;
    for (size_t i = 0; i < lengths.size(); ++i) ids.push_back(static_cast<int64_t>(i));
    const plan::PackedRow row = plan::pack_row(ids, lengths, R);
    const TokenLayout global = row_layout(row);
    EXPECT_TRUE(global.segment.equal(test::packed_layout(lengths, 2 * R).segment));
    const auto shares = ring_shares(plan::ShardMap(row, R, U, plan::Layout::zigzag));
    ASSERT_EQ(static_cast<int>(shares.size()), R);
    for (int p = 0; p < R; ++p) {
      TokenLayout expected = test::layout_of(global, test::share_of(global, R, U, p, true));
      EXPECT_TRUE(shares[p].segment.equal(expected.segment)) << "R " << R << " U " << U << " p " << p;
      EXPECT_TRUE(shares[p]
                      .order.masked_select(expected.segment.ge(0))
                      .equal(expected.order.masked_select(expected.segment.ge(0))));
    }
  }
}

}  // namespace
