// The Gated DeltaNet layer against the single-process token-by-token reference
// (gated_delta_reference.h), output and the gradients of the input and of every
// parameter, fp64 rtol 1e-9: on one process, and under mmsp-run on every mesh of
// the world (Ulysses, ring state passing, hybrid; zigzag and contiguous layouts;
// packed batches with segments shorter than a chunk; fewer key than value heads).
// The bytes each forward sends must equal the formulas.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <random>

#include "gated_delta_reference.h"
#include "mmsp/attention/linear/gated_delta_ring.h"
#include "mmsp/attention/linear/gated_delta_tiles.h"
#include "mmsp/attention/plan_layout.h"
#include "mmsp/attention/step_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/model/layers/gated_deltanet_layer.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/plan/placement.h"
#include "mmsp/plan/shard_map.h"
#include "mmsp/train/memory/memory_counter.h"
#include "mmsp/train/memory/memory_estimate.h"
#include "multirank.h"
#include "packed_batch.h"
#include "row_compare.h"

using namespace mmsp;
using namespace mmsp::attention;
using namespace mmsp::model;
using at::Tensor;

using test::expect_rows_match;
using test::gather_rows;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

GatedDeltaNetConfig small_config(int64_t chunk) {
  GatedDeltaNetConfig c;
  c.hidden_size = 12;
  c.num_key_heads = 2;  // fewer key heads than value heads
  c.num_value_heads = 4;
  c.key_head_dim = 6;
  c.value_head_dim = 5;  // K != V: a transposed state would not fit
  c.conv_kernel = 4;
  c.chunk = chunk;
  return c;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  const double tol = 1e-9 * (1 + want.abs().max().item<double>());
  EXPECT_LE(diff, tol) << what << ": max difference " << diff;
}

std::vector<Tensor> params_of(GatedDeltaNetWeights& w) {
  std::vector<Tensor> out;
  for (auto& [name, t] : w.named()) out.push_back(t);
  return out;
}

GatedDeltaNetWeights with_grad(const GatedDeltaNetWeights& w) {
  GatedDeltaNetWeights c = w;
  for (Tensor* t :
       {&c.in_proj_qkvz, &c.in_proj_ba, &c.conv1d_weight, &c.A_log, &c.dt_bias, &c.norm_weight, &c.out_proj})
    *t = t->detach().clone().requires_grad_();
  return c;
}

}  // namespace

TEST(GatedDeltaNetLayer, HuggingFaceParameterNamesAndShapes) {
  GatedDeltaNetConfig c = small_config(64);
  GatedDeltaNetWeights w = GatedDeltaNetWeights::random(c, kF64, 1);
  std::vector<std::string> names;
  for (auto& [name, t] : w.named()) names.push_back(name);
  EXPECT_THAT(names, ::testing::ElementsAre("in_proj_qkvz.weight", "in_proj_ba.weight", "conv1d.weight", "A_log",
                                            "dt_bias", "norm.weight", "out_proj.weight"));
  EXPECT_EQ(w.in_proj_qkvz.sizes(), at::IntArrayRef({2 * 12 + 2 * 20, 12}));
  EXPECT_EQ(w.conv1d_weight.sizes(), at::IntArrayRef({2 * 12 + 20, 1, 4}));
  w.A_log = at::zeros({3}, kF64);
  try {
    w.check(c);
    ADD_FAILURE() << "expected a shape error";
  } catch (const Error& e) { EXPECT_THAT(e.what(), ::testing::HasSubstr("A_log must have shape [4]")); }
}

TEST(GatedDeltaNetLayer, HeadsNotDivisibleByUlyssesIsAClearError) {
  try {
    check_gated_delta_heads(2, 4, 4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("ulysses degree 4 must divide the linear-attention key heads (2)"));
  }
  EXPECT_NO_THROW(check_gated_delta_heads(2, 4, 2));
}

// The index a step plans once (RingRunIndex) serves every layer call: the same output as
// the layer's own; one planned for another chunk or kernel is refused, naming both.
TEST(GatedDeltaNetLayer, UsesTheStepsPlannedIndex) {
  at::manual_seed(5);
  const GatedDeltaNetConfig c = small_config(8);
  const GatedDeltaNetWeights w = GatedDeltaNetWeights::random(c, kF64, 13);
  const TokenLayout layout = test::packed_layout({30, 17, 9}, 4);
  const Tensor x = at::randn({layout.size(), c.hidden_size}, kF64);
  const Tensor own = gated_deltanet_forward(w, c, x, {{}, {layout}});
  auto planned =
      std::make_shared<const RingRunIndex>(RingRunIndex::make({layout}, 0, c.conv_kernel, c.chunk, x.device()));
  for (int layer = 0; layer < 2; ++layer)
    EXPECT_TRUE(at::equal(gated_deltanet_forward(w, c, x, {{}, {layout}, planned}), own)) << "call " << layer;
  auto other = std::make_shared<const RingRunIndex>(RingRunIndex::make({layout}, 0, c.conv_kernel, 64, x.device()));
  try {
    gated_deltanet_forward(w, c, x, {{}, {layout}, other});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the step planned its index for conv kernel 4 and chunk 64, "
                                               "but the layer has conv kernel 4 and chunk 8"));
  }
}

// One process, the whole packed batch: chunks of 64 and of 8 (many chunks per segment).
// The conv keeps its input and its pre-activation between forward and backward, not
// the W gathered taps and their weighted copies: after the forward the graph holds
// ext [T + 1, Ch], pre and out [T, Ch]; its weight gradient equals the one of the
// gathered-taps formula, out_t = silu(Σ_j w[:, j] x_{t−W+1+j}) written with shifts.
TEST(GatedDeltaNetLayer, ConvKeepsItsInputNotItsTaps) {
  at::manual_seed(12);
  const int64_t T = 8192, Ch = 64, W = 4;
  const TokenLayout layout = test::packed_layout({T}, 1);
  const auto index = attention::RingRunIndex::make({layout}, 0, W, 64, at::kCPU);
  Tensor x = at::randn({T, Ch}, kF64).requires_grad_(), w = at::randn({Ch, W}, kF64).requires_grad_();
  train::MemoryCounter counter;
  Tensor out = attention::gated_delta_conv(x, w, index, dist::GroupPtr());
  const int64_t held = counter.current_bytes(), formula = (3 * T + 1) * Ch * 8;
  EXPECT_LE(held, formula + (int64_t{1} << 20)) << "formula " << formula;
  std::vector<Tensor> got = torch::autograd::grad({(out * out).sum()}, {x, w});
  Tensor padded = at::cat({at::zeros({W - 1, Ch}, kF64), x});
  Tensor pre = at::zeros({T, Ch}, kF64);
  for (int64_t j = 0; j < W; ++j) pre = pre + padded.narrow(0, j, T) * w.select(1, j);
  Tensor ref = at::silu(pre);
  std::vector<Tensor> want = torch::autograd::grad({(ref * ref).sum()}, {x, w});
  EXPECT_TRUE(at::allclose(out, ref, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(got[0], want[0], 1e-10, 1e-10));
  EXPECT_TRUE(at::allclose(got[1], want[1], 1e-10, 1e-10));
}

TEST(GatedDeltaNetLayer, OneProcessEqualsTheReference) {
  for (int64_t chunk : {int64_t{64}, int64_t{8}}) {
    at::manual_seed(3);
    GatedDeltaNetConfig c = small_config(chunk);
    GatedDeltaNetWeights w = with_grad(GatedDeltaNetWeights::random(c, kF64, 11));
    GatedDeltaNetWeights wr = with_grad(w);
    TokenLayout layout = test::packed_layout({90, 3, 41, 1, 70}, 4);
    const int64_t T = layout.size();
    Tensor x = at::randn({T, c.hidden_size}, kF64);
    Tensor xl = x.clone().requires_grad_(), xr = x.clone().requires_grad_();
    Tensor mask = (layout.segment >= 0).to(at::kDouble).unsqueeze(1);
    Tensor dy = at::randn({T, c.hidden_size}, kF64);
    Tensor ref = test::gated_deltanet_reference(wr, c, xr, layout);
    Tensor out = gated_deltanet_forward(w, c, xl, {{}, {layout}});
    expect_close(out, ref, "output chunk " + std::to_string(chunk));
    EXPECT_EQ((out * (1 - mask)).abs().max().item<double>(), 0.0) << "padding rows must be zero";
    std::vector<Tensor> in_l = params_of(w), in_r = params_of(wr);
    in_l.push_back(xl);
    in_r.push_back(xr);
    std::vector<Tensor> gl = torch::autograd::grad({(out * dy).sum()}, in_l);
    std::vector<Tensor> gr = torch::autograd::grad({(ref * dy).sum()}, in_r);
    auto named = w.named();
    for (size_t i = 0; i < gl.size(); ++i)
      expect_close(gl[i], gr[i], "d" + (i < named.size() ? named[i].first : std::string("x")));
  }
}

// Over sequence tiles (--tiled-mlp on a hybrid model): segments that cross tile borders,
// start and end on them, are shorter than a tile or than the conv's context; tiles of
// fewer rows than the conv reads back (chunk 2: tiles of 2 rows). Equal to the untiled
// layer (fp64, 1e-12) and to the token recurrence, output and every gradient. Tiles of 5
// with chunks of 8: tile borders inside chunks.
TEST(GatedDeltaNetLayer, SequenceTilesEqualTheWholeLayer) {
  struct Case {
    int64_t chunk, tile;
  };
  for (const Case& tc : {Case{8, 16}, Case{8, 5}, Case{2, 2}, Case{64, 64}, Case{8, kAutoMlpTile}}) {
    at::manual_seed(5);
    GatedDeltaNetConfig c = small_config(tc.chunk);
    GatedDeltaNetWeights w = with_grad(GatedDeltaNetWeights::random(c, kF64, 17));
    GatedDeltaNetWeights wt = with_grad(w), wr = with_grad(w);
    TokenLayout layout = test::packed_layout({90, 3, 41, 1, 70, 16}, 4);
    const int64_t T = layout.size();
    Tensor x = at::randn({T, c.hidden_size}, kF64), dy = at::randn({T, c.hidden_size}, kF64);
    Tensor xw = x.clone().requires_grad_(), xt = x.clone().requires_grad_(), xr = x.clone().requires_grad_();
    GatedDeltaNetConfig ct = c;
    ct.tile = tc.tile;
    const std::string where = "chunk " + std::to_string(tc.chunk) + " tile " + std::to_string(tc.tile);
    Tensor whole = gated_deltanet_forward(w, c, xw, {{}, {layout}});
    Tensor tiled = gated_deltanet_forward(wt, ct, xt, {{}, {layout}});
    Tensor ref = test::gated_deltanet_reference(wr, c, xr, layout);
    EXPECT_LE((tiled - whole).abs().max().item<double>(), 1e-12) << where << " output";
    expect_close(tiled, ref, where + " output against the recurrence");
    std::vector<Tensor> in_w = params_of(w), in_t = params_of(wt), in_r = params_of(wr);
    in_w.push_back(xw);
    in_t.push_back(xt);
    in_r.push_back(xr);
    std::vector<Tensor> gw = torch::autograd::grad({(whole * dy).sum()}, in_w);
    std::vector<Tensor> gt = torch::autograd::grad({(tiled * dy).sum()}, in_t);
    std::vector<Tensor> gr = torch::autograd::grad({(ref * dy).sum()}, in_r);
    auto named = w.named();
    for (size_t i = 0; i < gt.size(); ++i) {
      const std::string what = where + " d" + (i < named.size() ? named[i].first : std::string("x"));
      EXPECT_LE((gt[i] - gw[i]).abs().max().item<double>(), 1e-12 * (1 + gw[i].abs().max().item<double>())) << what;
      expect_close(gt[i], gr[i], what + " against the recurrence");
    }
  }
}

// The tiles of a share: borders, the conv's context rows, which run goes on across a
// border; a run that starts mid-segment (a ring's share) is refused, naming it.
TEST(GatedDeltaNetLayer, SequenceTilePlan) {
  const std::vector<TokenRun> runs{{0, 10, 0, 0}, {10, 3, 1, 0}, {14, 6, 2, 0}};  // row 13: padding
  const auto tiles = plan_sequence_tiles(runs, 20, 8, 4, 8, at::kCPU);
  ASSERT_EQ(tiles.size(), 3u);
  EXPECT_EQ(tiles[0].context, 0);
  EXPECT_EQ(tiles[1].context, 3);
  EXPECT_EQ(tiles[2].length, 4);
  EXPECT_TRUE(tiles[0].carries);
  EXPECT_TRUE(tiles[1].continues);     // segment 0's rows 8, 9
  EXPECT_EQ(tiles[1].chunks.runs, 3);  // 8–9, 10–12, 14–15
  EXPECT_TRUE(tiles[1].carries);       // segment 2 goes on
  EXPECT_TRUE(tiles[2].continues);
  EXPECT_FALSE(tiles[2].carries);
  EXPECT_EQ(sequence_tile_rows(5, 100, 64, 8), 5);
  EXPECT_EQ(sequence_tile_rows(kAutoSequenceTile, 100, 64, 8), 56);  // 2 tiles of 50, whole chunks
  GatedDeltaNetConfig bad = small_config(8);  // refused by the layer's first check, before any exchange
  bad.tile = -2;
  EXPECT_THROW(bad.check(), Error);
  try {
    plan_sequence_tiles({{0, 4, 3, 7}}, 4, 2, 4, 8, at::kCPU);
    ADD_FAILURE() << "a run starting at order 7 must be refused";
  } catch (const std::exception& e) { EXPECT_THAT(e.what(), ::testing::HasSubstr("starts at order 7")); }
}

namespace {

struct MeshCase {
  int64_t chunk;
  bool zigzag;
  std::vector<int64_t> lengths;  // empty: random
  bool adaptive = false;         // the planner's adaptive placement (loose targets: short ones whole)
  int64_t tile = 0;              // GatedDeltaNetConfig::tile (sequence tiles where no ring is)
};

void run_mesh_case(const dist::Mesh& mesh, const MeshCase& mc, std::mt19937& rng) {
  const int R = mesh.ring()->size(), U = mesh.ulysses()->size();
  const int r = mesh.ring()->rank(), u = mesh.ulysses()->rank();
  const std::string where = mesh.shape().str() + " chunk " + std::to_string(mc.chunk) +
                            (mc.zigzag ? " zigzag" : " contiguous") + (mc.tile ? " tiles" : "");
  GatedDeltaNetConfig c = small_config(mc.chunk);
  c.tile = mc.tile;
  // Random segment lengths 1..90 (some shorter than 2R, than the conv, than a chunk).
  const std::vector<int64_t> lengths = mc.lengths.empty() ? test::random_lengths(rng, 4, 90) : mc.lengths;
  TokenLayout global;
  test::ContextSlots sharded;
  std::vector<int64_t> split;  // a mixed placement's split slots; empty: every slot exchanged
  if (mc.adaptive) {
    std::vector<int64_t> ids(lengths.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
    const plan::PackedRow row =
        plan::pack_row(ids, lengths, R, plan::place_segments(lengths, R, U, plan::Placement::adaptive, {1.0, 100.0}));
    const plan::ShardMap map(row, R, U, plan::Layout::zigzag);
    global = attention::row_layout(row);
    sharded = {attention::ring_shares(map), map.tokens(r * U + u)};
    split = attention::split_slots(map);
    EXPECT_FALSE(split.empty()) << where << ": nothing held whole, the case would test zigzag";
  } else {
    global = test::packed_layout(lengths, 2 * R);
    sharded = test::context_slots(global, R, U, r, u, mc.zigzag);
  }
  const int64_t T = global.size();
  GatedDeltaNetWeights wr = with_grad(GatedDeltaNetWeights::random(c, kF64, rng()));
  GatedDeltaNetWeights w = with_grad(wr);
  Tensor x = at::randn({T, c.hidden_size}, kF64);  // same on every rank (seeded alike)
  Tensor dy = at::randn({T, c.hidden_size}, kF64);
  Tensor xr = x.clone().requires_grad_();
  Tensor ref = test::gated_deltanet_reference(wr, c, xr, global);
  std::vector<Tensor> in_r = params_of(wr);
  in_r.push_back(xr);
  std::vector<Tensor> gr = torch::autograd::grad({(ref * dy).sum()}, in_r);

  const std::vector<TokenLayout>& shares = sharded.shares;
  const std::vector<int64_t>& mine = sharded.mine;
  Tensor xl = gather_rows(x, mine).requires_grad_();
  const dist::CommSnapshot before = mesh.stats().snapshot();
  Tensor out = gated_deltanet_forward(w, c, xl, {{mesh.ring(), mesh.ulysses()}, shares, nullptr, split, nullptr});
  const dist::CommSnapshot sent = mesh.stats().snapshot() - before;
  expect_rows_match(out.detach(), ref.detach(), mine, where + " output");

  // Bytes: Ulysses all-to-alls (all-to-all-v of the split slots under a mixed placement) and
  // the ring's two all-gathers (over the split shares' runs), as the formulas say.
  std::vector<int64_t> exchanged(U, xl.size(0));
  if (!split.empty()) exchanged.assign(split.begin() + r * U, split.begin() + (r + 1) * U);
  const int64_t ulysses_bytes = gated_delta_ulysses_bytes(c, exchanged, u, 8);
  const dist::CommKind a2a = split.empty() ? dist::CommKind::all_to_all : dist::CommKind::all_to_all_v;
  EXPECT_EQ(sent.at(a2a, dist::Pass::forward).bytes, ulysses_bytes) << where;
  const std::vector<TokenLayout> ring_layouts = split.empty() ? shares : attention::split_shares(shares, split, U);
  const int64_t max_runs = ring_layouts[0].size() > 0 ? RingRuns::make(ring_layouts).max_runs() : 0;
  const int64_t ring_bytes =
      gated_delta_ring_conv_bytes(R, max_runs, c.conv_kernel, c.conv_dim() / U, 8) +
      gated_delta_ring_state_bytes(R, max_runs, c.num_value_heads / U, c.key_head_dim, c.value_head_dim, 8);
  EXPECT_EQ(sent.at(dist::CommKind::all_gather_v, dist::Pass::forward).bytes, ring_bytes) << where;

  std::vector<Tensor> in_l = params_of(w);
  in_l.push_back(xl);
  std::vector<Tensor> gl = torch::autograd::grad({(out * gather_rows(dy, mine)).sum()}, in_l);
  expect_rows_match(gl.back(), gr.back(), mine, where + " dx");
  auto named = w.named();
  for (size_t i = 0; i + 1 < gl.size(); ++i) {
    Tensor g = gl[i].clone();
    dist::all_reduce_(g, *mesh.context());  // parameter gradients: the sum over the context group
    expect_close(g, gr[i], where + " d" + named[i].first);
  }
}

}  // namespace

TEST(MultiRank, EveryMeshEqualsTheTokenRecurrence) {
  std::mt19937 rng(77);  // same batches on every rank
  at::manual_seed(77);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (small_config(64).num_key_heads % mesh.ulysses()->size() != 0) continue;  // the error test below
    for (int64_t chunk : {int64_t{64}, int64_t{8}})
      for (bool zigzag : {true, false}) {
        if (!zigzag && mesh.ring()->size() == 1) continue;  // the same layout
        run_mesh_case(mesh, {chunk, zigzag, {}}, rng);
      }
  }
}

// Sequence tiles (--tiled-mlp on a hybrid model) on every mesh: tiled where a share is
// whole (one rank, Ulysses), whole under a ring (state passing), and under a mixed
// placement the slots held whole tiled at home. Same bytes sent as untiled.
TEST(MultiRank, SequenceTilesOnEveryMeshEqualTheTokenRecurrence) {
  std::mt19937 rng(78);
  at::manual_seed(78);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (small_config(8).num_key_heads % mesh.ulysses()->size() != 0) continue;
    run_mesh_case(mesh, {8, true, {}, false, 16}, rng);
    run_mesh_case(mesh, {8, true, {200, 3, 70, 5, 1}, false, 8}, rng);
    if (mesh.context()->size() > 1) run_mesh_case(mesh, {8, true, {190, 3, 5, 2, 4, 9, 60}, true, 8}, rng);
  }
}

// Adaptive placement: short segments whole on one rank (conv and rule at home, every head),
// long ones split; a pack with a long one, a pack of short ones only. Equal to the token
// recurrence, and only the split slots' bytes are sent.
TEST(MultiRank, AdaptivePlacementExchangesOnlySplitSegments) {
  std::mt19937 rng(79);
  at::manual_seed(79);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int S = mesh.ring()->size() * mesh.ulysses()->size();
    if (small_config(64).num_key_heads % mesh.ulysses()->size() != 0) continue;
    for (bool with_long : {true, false}) {
      std::vector<int64_t> lengths;
      if (with_long) lengths.push_back(std::uniform_int_distribution<int64_t>(40, 90)(rng));
      for (int i = 0; i < 3 * S + 2; ++i) lengths.push_back(std::uniform_int_distribution<int64_t>(1, 12)(rng));
      for (int64_t chunk : {int64_t{64}, int64_t{8}}) run_mesh_case(mesh, {chunk, true, lengths, true}, rng);
    }
  }
}

// Segments so short that some ring ranks hold no real token of any of them: those
// ranks still take part in every collective, backward included.
TEST(MultiRank, RanksWithoutTokensStayInStep) {
  std::mt19937 rng(78);
  at::manual_seed(78);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (small_config(64).num_key_heads % mesh.ulysses()->size() != 0) continue;
    run_mesh_case(mesh, {64, true, {1, 1}}, rng);
    run_mesh_case(mesh, {64, true, {1, 2, 3}}, rng);
  }
}

// A ulysses degree that does not divide the heads fails on every rank before any
// collective: afterwards every group is still in step.
TEST(MultiRank, HeadsNotDivisibleFailBeforeAnyCollective) {
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int R = mesh.ring()->size(), U = mesh.ulysses()->size();
    if (U == 1) continue;
    GatedDeltaNetConfig c = small_config(64);
    c.num_key_heads = U + 1;
    c.num_value_heads = U + 1;
    TokenLayout l = test::packed_layout({4 * R * U}, 2 * R);
    std::vector<TokenLayout> shares;
    for (int p = 0; p < R; ++p) shares.push_back(l.slice(p * l.size() / R, l.size() / R));
    GatedDeltaNetWeights w = GatedDeltaNetWeights::random(c, kF64, 5);
    try {
      gated_deltanet_forward(w, c, at::zeros({l.size() / R / U, c.hidden_size}, kF64),
                             {{mesh.ring(), mesh.ulysses()}, shares});
      ADD_FAILURE() << "expected an error for " << c.num_key_heads << " heads";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("must divide the linear-attention key heads"));
    }
  }
  for (const dist::Mesh& mesh : test::all_meshes()) {
    Tensor one = at::ones({1}, kF64);
    dist::all_reduce_(one, *mesh.context());
    EXPECT_EQ(one.item<double>(), mesh.context()->size());
  }
}

// bf16 activations through Gloo (which has no bf16 collectives: bytes travel as a
// same-size type) with fp32 states: as close to the fp64 reference as the bf16
// layer on one process is, gradients finite.
TEST(MultiRank, Bf16ActivationsWithFp32States) {
  std::mt19937 rng(79);
  at::manual_seed(79);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    const int R = mesh.ring()->size(), U = mesh.ulysses()->size();
    if (small_config(64).num_key_heads % U != 0 || mesh.context()->size() == 1) continue;
    GatedDeltaNetConfig c = small_config(8);
    TokenLayout global = test::packed_layout(test::random_lengths(rng, 3, 60), 2 * R);
    GatedDeltaNetWeights w64 = GatedDeltaNetWeights::random(c, kF64, 9);
    Tensor x = at::randn({global.size(), c.hidden_size}, kF64);
    Tensor ref = test::gated_deltanet_reference(w64, c, x, global);
    GatedDeltaNetWeights w = w64;
    for (Tensor* t :
         {&w.in_proj_qkvz, &w.in_proj_ba, &w.conv1d_weight, &w.A_log, &w.dt_bias, &w.norm_weight, &w.out_proj})
      *t = t->to(at::kBFloat16).requires_grad_();
    std::vector<TokenLayout> shares;
    std::vector<int64_t> mine;
    for (int p = 0; p < R; ++p) {
      std::vector<int64_t> slots = test::share_of(global, R, U, p, true);
      shares.push_back(test::layout_of(global, slots));
      if (p == mesh.ring()->rank()) {
        const int64_t n = static_cast<int64_t>(slots.size()) / U;
        mine.assign(slots.begin() + mesh.ulysses()->rank() * n, slots.begin() + (mesh.ulysses()->rank() + 1) * n);
      }
    }
    Tensor xl = gather_rows(x, mine).to(at::kBFloat16).requires_grad_();
    Tensor out = gated_deltanet_forward(w, c, xl, {{mesh.ring(), mesh.ulysses()}, shares});
    ASSERT_EQ(out.scalar_type(), at::kBFloat16);
    out.to(at::kFloat).pow(2).sum().backward();
    Tensor want = gather_rows(ref, mine);
    Tensor one = gated_deltanet_forward(w, c, x.to(at::kBFloat16), {{}, {global}}).detach().to(at::kDouble);
    const double diff = (out.to(at::kDouble) - want).abs().max().item<double>();
    const double diff_one = (gather_rows(one, mine) - want).abs().max().item<double>();
    // bf16 rounding alone (the one-process bf16 layer) is a few per cent; splitting
    // the work must not add to it beyond rounding in a different order.
    const double scale = 1 + want.abs().max().item<double>();
    EXPECT_LE(diff, 0.1 * scale) << mesh.shape().str();
    EXPECT_LE(diff, 1.5 * diff_one + 1e-2 * scale) << mesh.shape().str() << ": one process differs by " << diff_one;
    EXPECT_TRUE(xl.grad().isfinite().all().item<bool>()) << mesh.shape().str();
    EXPECT_TRUE(w.A_log.grad().isfinite().all().item<bool>()) << mesh.shape().str();
  }
}

namespace {

// Qwen3.5-0.8B's linear-attention shapes (hidden 1,024, 16 key and value heads of 128),
// in fp32, or bf16 with MMSP_TEST_GDN_BF16=1.
struct ReleasedShapes {
  GatedDeltaNetConfig c;
  model::TextConfig text;
  at::ScalarType type = at::kFloat;
};
ReleasedShapes released_shapes() {
  ReleasedShapes r;
  r.c.hidden_size = 1024;
  r.c.num_key_heads = r.c.num_value_heads = 16;
  r.c.key_head_dim = r.c.value_head_dim = 128;
  r.c.conv_kernel = 4;
  r.text.hidden_size = r.c.hidden_size;
  r.text.linear_num_key_heads = r.text.linear_num_value_heads = 16;
  r.text.linear_key_head_dim = r.text.linear_value_head_dim = 128;
  const char* dtype = std::getenv("MMSP_TEST_GDN_BF16");
  if (dtype && std::string(dtype) == "1") r.type = at::kBFloat16;
  return r;
}

}  // namespace

// The layer at Qwen3.5-0.8B's linear-attention shapes on one process: what its forward
// keeps and its step's peak above its input and weights, against the preflight's formula
// (gated_delta_layer_bytes: kept and backward per token). fp32 here: a bf16 step of 2,048
// tokens takes 96 s on this CPU's bf16 matmul (MMSP_TEST_GDN_BF16=1 runs it: kept 90.5 KB
// a token against the formula's 94.2, peak 151.8 against 155.6; fp32 143.9 against 172.0
// and 177.4 against 204.8).
TEST(GatedDeltaNetLayer, ReleasedShapesStepPeakWithinItsEstimate) {
  at::manual_seed(13);
  const ReleasedShapes shapes = released_shapes();
  GatedDeltaNetConfig c = shapes.c;
  const model::TextConfig& text = shapes.text;
  const at::ScalarType type = shapes.type;
  const int64_t T = 2048;
  GatedDeltaNetWeights w = with_grad(GatedDeltaNetWeights::random(c, type, 5));
  Tensor x = (0.5 * at::randn({T, c.hidden_size}, kF64)).to(type).requires_grad_();
  const TokenLayout layout = test::packed_layout({T}, 1);
  train::MemoryCounter counter;
  Tensor out = gated_deltanet_forward(w, c, x, {{}, {layout}});
  // The input projection's rows for what travels and for z, copied once a forward and
  // kept by its matmuls: weights' bytes, not tokens' (the preflight's parameters).
  const int64_t b = static_cast<int64_t>(c10::elementSize(type));
  const int64_t copies = (2 * c.key_dim() + 2 * c.value_dim() + 2 * c.num_value_heads) * c.hidden_size * b;
  const int64_t kept = counter.current_bytes() - out.nbytes() - copies;
  std::vector<Tensor> inputs = params_of(w);
  inputs.push_back(x);
  std::vector<Tensor> got = torch::autograd::grad({out.to(at::kFloat).pow(2).sum()}, inputs);
  const int64_t peak = counter.peak_bytes() - copies;
  const train::GatedDeltaLayerBytes formula = train::gated_delta_layer_bytes(text, b, /*ring=*/1);
  std::cout << "[ " << c10::toString(type) << ": kept " << kept / T << " B a token (formula " << formula.kept
            << "), step peak " << peak / T << " B a token (formula " << formula.kept + formula.backward << ") ]\n";
  // The preflight's band: estimate ÷ measured within 1.0–1.2.
  EXPECT_LE(kept, formula.kept * T);
  EXPECT_GE(kept * 12, formula.kept * T * 10);
  EXPECT_LE(peak, (formula.kept + formula.backward) * T);
  EXPECT_GE(peak * 12, (formula.kept + formula.backward) * T * 10);
}

// The same shapes over sequence tiles of 256 rows: what the layer keeps and its step's
// peak grow by what gated_delta_layer_bytes says a token (kept: what travels, o | z, a
// state per tile border; backward: the gradients of what travels and of the input, o | z's
// in place of o | z), measured as the growth from 1,024 to 2,048 tokens (the weights'
// copies and gradients do not grow); the peak at 2,048 within the formula with one tile's
// work and three copies of the weights.
TEST(GatedDeltaNetLayer, ReleasedShapesTiledStepGrowsByItsEstimate) {
  at::manual_seed(13);
  const ReleasedShapes shapes = released_shapes();
  GatedDeltaNetConfig c = shapes.c;
  const model::TextConfig& text = shapes.text;
  const at::ScalarType type = shapes.type;
  c.tile = 256;
  const int64_t b = static_cast<int64_t>(c10::elementSize(type));
  const train::GatedDeltaLayerBytes formula = train::gated_delta_layer_bytes(text, b, /*ring=*/1, c.tile);
  GatedDeltaNetWeights w = with_grad(GatedDeltaNetWeights::random(c, type, 5));
  int64_t weight_bytes = 0;
  for (const Tensor& p : params_of(w)) weight_bytes += p.nbytes();
  std::vector<int64_t> kept, peak;
  for (int64_t T : {int64_t{1024}, int64_t{2048}}) {
    Tensor x = (0.5 * at::randn({T, c.hidden_size}, kF64)).to(type).requires_grad_();
    Tensor dy = at::randn({T, c.hidden_size}, kF64).to(type);  // the output's gradient, made before counting
    train::MemoryCounter counter;
    Tensor out = gated_deltanet_forward(w, c, x, {{}, {test::packed_layout({T}, 1)}});
    kept.push_back(counter.current_bytes() - out.nbytes());
    std::vector<Tensor> inputs = params_of(w);
    inputs.push_back(x);
    std::vector<Tensor> got = torch::autograd::grad({out}, inputs, {dy});
    peak.push_back(counter.peak_bytes());
  }
  const int64_t kept_growth = (kept[1] - kept[0]) / 1024, peak_growth = (peak[1] - peak[0]) / 1024;
  std::cout << "[ " << c10::toString(type) << ", tiles of 256: kept grows " << kept_growth << " B a token (formula "
            << formula.kept << "), the step's peak " << peak_growth << " (formula " << formula.kept + formula.backward
            << "); peak at 2,048: " << peak[1] / 2048 << " B a token ]\n";
  EXPECT_LE(kept_growth, formula.kept * 11 / 10);
  EXPECT_GE(kept_growth, formula.kept * 9 / 10);
  EXPECT_LE(peak_growth - kept_growth, formula.backward * 11 / 10);
  EXPECT_GE(peak_growth - kept_growth, formula.backward * 9 / 10);
  EXPECT_LE(peak_growth, (formula.kept + formula.backward) * 101 / 100);
  EXPECT_LE(peak[1], 2048 * (formula.kept + formula.backward) + formula.tile + 3 * weight_bytes);
  // Far below the whole layer's (the test before: ~194 KB a token in fp32).
  const train::GatedDeltaLayerBytes whole = train::gated_delta_layer_bytes(text, b, 1);
  EXPECT_LT(peak_growth, (whole.kept + whole.backward) / 2);
}
