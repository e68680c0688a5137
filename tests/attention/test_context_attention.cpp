// Multi-rank equivalence of every attention scheme (ulysses, ring, hybrid) with the
// single-process kernel on the unsharded packed batch: output and dq, dk, dv in
// fp64, zigzag and contiguous layouts, causal and bidirectional, GQA, segments
// shorter than 2 × ring and lengths divisible by nothing. Every mesh of the world.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <random>

#include "mmsp/attention/context_attention.h"
#include "mmsp/attention/plan_layout.h"
#include "mmsp/core/check.h"
#include "mmsp/plan/attention_cost.h"
#include "mmsp/plan/placement.h"
#include "mmsp/plan/shard_map.h"
#include "multirank.h"
#include "packed_batch.h"
#include "row_compare.h"

using namespace mmsp;
using namespace mmsp::attention;
using at::Tensor;

using test::expect_rows_match;
using test::gather_rows;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);
constexpr int64_t kHeads = 12, kDim = 8;

struct SchemeCase {
  int64_t kv_heads;
  bool causal, zigzag;
  AttentionKernel kernel = parse_attention_kernel("blockwise");
};

// The scheme the mesh selects on this rank's slots `mine` (global token per slot, -1 for
// padding) against the kernel on the whole row: output and dq, dk, dv.
// split_slots: a mixed placement's split slots per context rank (empty: zigzag's exchange).
void expect_scheme_equals_kernel(const dist::Mesh& mesh, const TokenLayout& global,
                                 const std::vector<TokenLayout>& shares, const std::vector<int64_t>& mine,
                                 int64_t kv_heads, const AttentionOptions& options, const std::string& where,
                                 const std::vector<int64_t>& split_slots = {}) {
  const int64_t T = global.size();
  Tensor q = at::randn({T, kHeads, kDim}, kF64).requires_grad_();
  Tensor k = at::randn({T, kv_heads, kDim}, kF64).requires_grad_();
  Tensor v = at::randn({T, kv_heads, kDim}, kF64).requires_grad_();
  Tensor w = at::randn({T, kHeads, kDim}, kF64);
  AttentionOptions reference = options;  // the blockwise kernel, whatever the scheme runs
  reference.kernel = parse_attention_kernel("blockwise");
  Tensor ref = local_attention(q, k, v, global, global, reference);
  (ref * w).sum().backward();

  Tensor ql = gather_rows(q.detach(), mine).requires_grad_();
  Tensor kl = gather_rows(k.detach(), mine).requires_grad_();
  Tensor vl = gather_rows(v.detach(), mine).requires_grad_();
  Tensor out = context_attention(ql, kl, vl, {mesh.ring(), mesh.ulysses()}, shares, options, split_slots);
  (out * gather_rows(w, mine)).sum().backward();
  expect_rows_match(out.detach(), ref.detach(), mine, where + " output");
  expect_rows_match(ql.grad(), q.grad(), mine, where + " dq");
  expect_rows_match(kl.grad(), k.grad(), mine, where + " dk");
  expect_rows_match(vl.grad(), v.grad(), mine, where + " dv");
}

void run_case(const dist::Mesh& mesh, const SchemeCase& c, std::mt19937& rng) {
  const int R = mesh.ring()->size(), U = mesh.ulysses()->size();
  const int r = mesh.ring()->rank(), u = mesh.ulysses()->rank();
  const std::string where = mesh.shape().str() + " kv" + std::to_string(c.kv_heads) +
                            (c.causal ? " causal" : " bidirectional") + (c.zigzag ? " zigzag" : " contiguous") + " " +
                            attention_kernel_name(c.kernel);
  // Segment lengths 1..45 (some shorter than 2R), padded to a multiple of 2R.
  TokenLayout global = test::packed_layout(test::random_lengths(rng, 5, 45), 2 * R);
  AttentionOptions options;
  options.causal = c.causal;
  options.block_q = 16;
  options.block_k = 24;
  options.kernel = c.kernel;
  const test::ContextSlots sharded = test::context_slots(global, R, U, r, u, c.zigzag);
  expect_scheme_equals_kernel(mesh, global, sharded.shares, sharded.mine, c.kv_heads, options, where);
}

}  // namespace

TEST(MultiRank, EverySchemeEqualsTheSingleProcessKernel) {
  std::mt19937 rng(2024);  // same batches on every rank
  at::manual_seed(2024);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int U = mesh.ulysses()->size();
    for (int64_t kv : {int64_t{1}, int64_t{2}, kHeads})
      for (bool causal : {true, false})
        for (bool zigzag : {true, false}) {
          if (kv % U != 0 && U % kv != 0) continue;  // covered by the error test below
          run_case(mesh, {kv, causal, zigzag}, rng);
        }
  }
}

// The fused kernel's plan (ATen's CPU flash kernel here, FlashAttention-2 varlen on CUDA)
// under every scheme: zigzag shares give each query run several key runs, merged by lse
// across calls like ring steps; the backward takes the ring's final out and lse.
TEST(MultiRank, FusedKernelUnderEverySchemeEqualsTheSingleProcessKernel) {
  std::mt19937 rng(2025);
  at::manual_seed(2025);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int64_t kv = mesh.ulysses()->size() == 3 ? 3 : 2;  // GQA that every degree divides
    for (bool causal : {true, false})
      for (bool zigzag : {true, false}) run_case(mesh, {kv, causal, zigzag, parse_attention_kernel("fused")}, rng);
  }
}

// Adaptive placement (docs/plan.md): short segments whole on one context rank, unpadded,
// long ones split zigzag; the layouts come from the plan's shard map, so today's Ulysses and
// ring compute it exactly. Rows mixing a long segment with short ones, only short ones, and
// one long segment (zigzag); loose balance targets for the first two so that these small
// rows keep segments whole (the default 1 % would split nearly all of them).
//
// With a segment held whole only the split slots are exchanged (an all-to-all-v and a ring of
// split shares) and the whole ones attend at home: the bytes each rank's counters see, forward
// and backward, must equal the plan's formulas (plan/attention_cost.h) for its own counts.
TEST(MultiRank, AdaptivePlacementEqualsTheSingleProcessKernel) {
  std::mt19937 rng(77);  // same rows on every rank
  at::manual_seed(77);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int R = mesh.ring()->size(), U = mesh.ulysses()->size(), u = mesh.ulysses()->rank();
    const int c = mesh.ring()->rank() * U + u;
    for (const char* pack : {"mixed", "short", "long"}) {
      std::vector<int64_t> lengths;
      const std::string kind = pack;
      if (kind != "short") lengths.push_back(std::uniform_int_distribution<int64_t>(40, 90)(rng));
      if (kind != "long")
        for (int i = 0; i < 3 * R * U + 2; ++i) lengths.push_back(std::uniform_int_distribution<int64_t>(1, 12)(rng));
      std::vector<int64_t> ids(lengths.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
      // a long segment alone gets the default targets (held whole it would leave the others idle)
      const plan::PlacementOptions balance =
          kind == "long" ? plan::PlacementOptions{} : plan::PlacementOptions{1.0, 100.0};
      const plan::PackedRow row =
          plan::pack_row(ids, lengths, R, plan::place_segments(lengths, R, U, plan::Placement::adaptive, balance));
      int whole = 0;
      for (const plan::Segment& s : row.segments) whole += s.home >= 0;
      if (kind != "long") { EXPECT_GT(whole, 0) << pack << ": nothing whole, the test would test zigzag"; }
      if (kind == "long" && R * U > 1) { EXPECT_EQ(whole, 0); }
      const plan::ShardMap map(row, R, U, plan::Layout::zigzag);
      const std::vector<int64_t> split_slots = attention::split_slots(map);
      EXPECT_EQ(split_slots.empty(), whole == 0) << pack;
      std::vector<int64_t> exchanged(U, map.local_length());
      int64_t share = map.local_length() * U;
      if (!split_slots.empty()) {
        share = 0;
        for (int p = 0; p < U; ++p) share += exchanged[p] = map.split_slots(c / U * U + p);
      }
      for (int64_t kv : {kHeads, int64_t{2}, int64_t{1}})
        for (bool causal : {true, false}) {
          if (kv % U != 0 && U % kv != 0) continue;
          AttentionOptions options;
          options.causal = causal;
          options.block_q = 8;
          options.block_k = 16;
          const std::string where = mesh.shape().str() + " adaptive " + pack + " kv" + std::to_string(kv) +
                                    (causal ? " causal" : " bidirectional");
          const dist::CommSnapshot ulysses0 = mesh.ulysses()->stats().snapshot(),
                                   ring0 = mesh.ring()->stats().snapshot();
          expect_scheme_equals_kernel(mesh, row_layout(row), ring_shares(map), map.tokens(c), kv, options, where,
                                      split_slots);
          const plan::AttentionShape shape{kHeads, kv, kDim, 8, 1};
          EXPECT_EQ((mesh.ulysses()->stats().snapshot() - ulysses0).total_bytes(),
                    static_cast<int64_t>(plan::ulysses_bytes(shape, exchanged, u)))
              << where << ": Ulysses bytes";
          EXPECT_EQ((mesh.ring()->stats().snapshot() - ring0).total_bytes(),
                    static_cast<int64_t>(plan::ring_bytes(shape, R, U, share)))
              << where << ": ring bytes";
        }
    }
  }
}

// The ring's exchanges overlapped with the blocks (the next K/V posted before a block
// computes, each dK/dV hop waited for after the next block's backward) or each waited for
// at once: the same output and gradients, bit for bit, on every mesh with a ring (fp64, GQA).
TEST(MultiRank, RingOverlapOnEqualsOffBitwise) {
  std::mt19937 rng(41);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int R = mesh.ring()->size(), U = mesh.ulysses()->size();
    if (R == 1) continue;
    const TokenLayout global = test::packed_layout(test::random_lengths(rng, 4, 45), 2 * R);
    const test::ContextSlots sharded =
        test::context_slots(global, R, U, mesh.ring()->rank(), mesh.ulysses()->rank(), true);
    const int64_t T = static_cast<int64_t>(sharded.mine.size()), kv = U == 3 ? 3 : 2;
    std::vector<std::vector<Tensor>> results;
    for (bool overlap : {false, true}) {
      at::manual_seed(5);
      Tensor q = at::randn({T, kHeads, kDim}, kF64).requires_grad_();
      Tensor k = at::randn({T, kv, kDim}, kF64).requires_grad_(), v = at::randn({T, kv, kDim}, kF64).requires_grad_();
      AttentionOptions options;
      options.block_q = 16, options.block_k = 24, options.overlap = overlap;
      Tensor out = context_attention(q, k, v, {mesh.ring(), mesh.ulysses()}, sharded.shares, options);
      (out * at::randn_like(out)).sum().backward();
      results.push_back({out.detach(), q.grad(), k.grad(), v.grad()});
    }
    for (size_t i = 0; i < results[0].size(); ++i)
      EXPECT_TRUE(results[0][i].equal(results[1][i])) << mesh.shape().str() << " tensor " << i << " (out, dq, dk, dv)";
  }
}

// Split-slot counts that do not fit the layouts (a plan bug, or a caller's) fail on every rank
// before any collective, naming the value: a whole segment whose tokens would then be split,
// and a ring rank whose split share differs from the others'. The groups stay in step.
TEST(MultiRank, BadSplitSlotsFailBeforeAnyCollective) {
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int R = mesh.ring()->size(), U = mesh.ulysses()->size(), S = R * U;
    if (S == 1) continue;
    std::vector<int64_t> lengths{60};
    for (int i = 0; i < 3 * S + 2; ++i) lengths.push_back(5);
    std::vector<int64_t> ids(lengths.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
    const plan::PackedRow row =
        plan::pack_row(ids, lengths, R, plan::place_segments(lengths, R, U, plan::Placement::adaptive, {1.0, 100.0}));
    const plan::ShardMap map(row, R, U, plan::Layout::zigzag);
    const std::vector<int64_t> good = attention::split_slots(map);
    ASSERT_FALSE(good.empty()) << mesh.shape().str();
    const int64_t L = map.local_length();
    const std::vector<TokenLayout> shares = ring_shares(map);
    auto attend = [&](const std::vector<int64_t>& split) {
      Tensor x = at::zeros({L, kHeads, kDim}, kF64);
      return context_attention(x, x, x, {mesh.ring(), mesh.ulysses()}, shares, {}, split);
    };
    // One more split slot on the first rank that holds a whole segment right after its split ones.
    int c = 0;
    while (c < S && (good[c] == L || map.tokens(c)[good[c]] < 0)) ++c;
    ASSERT_LT(c, S) << mesh.shape().str() << ": no rank holds a whole segment";
    std::vector<int64_t> bad = good;
    ++bad[c];
    try {
      attend(bad);
      ADD_FAILURE() << mesh.shape().str() << ": expected an error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("is held whole on context rank") != std::string::npos ||
                  what.find("every ring rank must hold the same number") != std::string::npos)
          << mesh.shape().str() << ": " << what;
    }
    EXPECT_TRUE(attend(good).isfinite().all().item<bool>()) << mesh.shape().str();  // still in step
  }
}

// Unsupported head counts fail on every rank before any collective: afterwards the
// groups still work (nobody was left inside an all-to-all).
TEST(MultiRank, BadHeadCountsFailBeforeAnyCollective) {
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int U = mesh.ulysses()->size(), R = mesh.ring()->size();
    if (U == 1) continue;
    TokenLayout l = test::packed_layout({8 * R * U}, 2 * R);
    std::vector<TokenLayout> shares(R, l.slice(0, l.size() / R));
    const int64_t n = l.size() / R / U;
    const int64_t bad_heads = U + 1, bad_kv = U == 3 ? 2 : U + 1;
    try {
      context_attention(at::zeros({n, bad_heads, 4}, kF64), at::zeros({n, 1, 4}, kF64), at::zeros({n, 1, 4}, kF64),
                        {mesh.ring(), mesh.ulysses()}, shares);
      ADD_FAILURE() << "expected an error for " << bad_heads << " heads";
    } catch (const Error& e) { EXPECT_THAT(e.what(), ::testing::HasSubstr("must divide the query heads")); }
    if (bad_kv * U * 2 <= 64) {
      const int64_t heads = bad_kv * U;
      EXPECT_THROW(context_attention(at::zeros({n, heads, 4}, kF64), at::zeros({n, bad_kv, 4}, kF64),
                                     at::zeros({n, bad_kv, 4}, kF64), {mesh.ring(), mesh.ulysses()}, shares),
                   Error);
    }
  }
  for (const dist::Mesh& mesh : test::all_meshes()) {  // every group is still in step
    TokenLayout l = test::packed_layout({4 * mesh.context()->size()}, 2 * mesh.ring()->size());
    const int R = mesh.ring()->size(), U = mesh.ulysses()->size();
    std::vector<TokenLayout> shares;
    for (int p = 0; p < R; ++p) shares.push_back(l.slice(p * l.size() / R, l.size() / R));
    const int64_t n = l.size() / R / U;
    Tensor out = context_attention(at::ones({n, 12, 4}, kF64), at::ones({n, 12, 4}, kF64), at::ones({n, 12, 4}, kF64),
                                   {mesh.ring(), mesh.ulysses()}, shares);
    EXPECT_TRUE(out.isfinite().all().item<bool>());
  }
}
