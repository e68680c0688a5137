// Multi-rank tests of the differentiable collectives, run by every rank under
// `mmsp-run -n N` (N = 1..4) on every mesh shape of N and every group of it. Each
// rank also simulates every rank's input locally and computes the reference output
// and, by autograd on that local graph, the reference gradient of its own input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <random>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/all_to_all.h"
#include "mmsp/dist/all_to_all_v.h"
#include "mmsp/dist/ring_exchange.h"
#include "mmsp/dist/selftest.h"
#include "multirank.h"

using namespace mmsp;
using namespace mmsp::dist;
using at::Tensor;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);
const MeshAxis kAxes[] = {MeshAxis::world, MeshAxis::dp, MeshAxis::ring, MeshAxis::ulysses, MeshAxis::context};

// Calls fn(group, where) for every group of every mesh.
void for_each_group(const std::function<void(const GroupPtr&, const std::string&)>& fn) {
  for (const Mesh& mesh : test::all_meshes())
    for (MeshAxis axis : kAxes) fn(mesh.group(axis), mesh.shape().str() + " " + mesh.group(axis)->name());
}

// Rank s's input for a test: distinct, irregular fp64 values.
Tensor input_of(int s, at::IntArrayRef shape, double salt) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return at::arange(n, kF64).mul(0.731).add(s * 3.17 + salt).sin().reshape(shape);
}
Tensor weight_of(int h, at::IntArrayRef shape) { return input_of(h, shape, 100.0).add(1.5); }

void expect_close(const Tensor& got, const Tensor& expected, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  if (got.numel() == 0) return;
  const double diff = (got - expected).abs().max().item<double>();
  EXPECT_LE(diff, 1e-12 * (1 + expected.abs().max().item<double>())) << what << ": max |diff| " << diff;
}

// Runs `op` distributed and as a local simulation over all ranks' inputs, then
// compares output and input gradient. `reference(xs, h)` is rank h's output.
void check_against_reference(const GroupPtr& group, const std::string& where,
                             const std::function<std::vector<int64_t>(int)>& shape_of,
                             const std::function<Tensor(const Tensor&)>& op,
                             const std::function<Tensor(const std::vector<Tensor>&, int)>& reference) {
  const int P = group->size(), r = group->rank();
  std::vector<Tensor> xs;
  for (int s = 0; s < P; ++s) xs.push_back(input_of(s, shape_of(s), 0.25).requires_grad_());
  Tensor local_loss = at::zeros({}, kF64);
  Tensor expected_out;
  for (int h = 0; h < P; ++h) {
    Tensor y = reference(xs, h);
    local_loss = local_loss + (y * weight_of(h, y.sizes())).sum();
    if (h == r) expected_out = y.detach();
  }
  local_loss.backward();

  Tensor x = input_of(r, shape_of(r), 0.25).requires_grad_();
  Tensor y = op(x);
  (y * weight_of(r, y.sizes())).sum().backward();
  expect_close(y, expected_out, where + " output");
  expect_close(x.grad(), xs[r].grad(), where + " input gradient");
}

}  // namespace

TEST(MultiRank, SelftestPassesOnEveryMesh) {
  for (const Mesh& mesh : test::all_meshes())
    for (const SelftestResult& r : run_selftest(mesh))
      EXPECT_TRUE(r.ok()) << mesh.shape().str() << " " << r.collective << " on " << r.group << ": forward error "
                          << r.forward_error << ", backward error " << r.backward_error;
}

TEST(MultiRank, GroupMembersAgreeAcrossRanks) {
  for_each_group([](const GroupPtr& g, const std::string& where) {
    Tensor mine = at::full({1}, static_cast<int64_t>(test::rank_env().rank), at::kLong);
    Tensor all = all_gather_v(mine, std::vector<int64_t>(g->size(), 1), g);
    std::vector<int> got(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
    EXPECT_EQ(got, g->members()) << where;
    EXPECT_EQ(g->members()[g->rank()], test::rank_env().rank) << where;
  });
}

TEST(MultiRank, AllToAllEveryDimPairMatchesReference) {
  const std::pair<int, int> dims[] = {{1, 0}, {0, 1}, {0, 2}, {2, 0}, {1, 2}, {2, 1}, {1, 1}};
  for_each_group([&](const GroupPtr& g, const std::string& where) {
    const int64_t P = g->size();
    for (auto [scatter, gather] : dims) {
      check_against_reference(
          g, where + " scatter " + std::to_string(scatter) + " gather " + std::to_string(gather),
          [&](int) {
            return std::vector<int64_t>{2 * P, 3 * P, P};
          },
          [&](const Tensor& x) { return all_to_all(x, scatter, gather, g); },
          [&](const std::vector<Tensor>& xs, int h) {
            std::vector<Tensor> pieces;
            for (const Tensor& x : xs) pieces.push_back(x.chunk(P, scatter)[h]);
            return at::cat(pieces, gather);
          });
    }
  });
}

TEST(MultiRank, AllToAllVRandomAndZeroCountsMatchReference) {
  std::mt19937 rng(1234);  // same stream on every rank
  for_each_group([&](const GroupPtr& g, const std::string& where) {
    const int P = g->size();
    for (int trial = 0; trial < 4; ++trial) {
      // counts[s][p]: rows rank s sends to rank p; trial 0 has every count zero.
      std::vector<std::vector<int64_t>> counts(P, std::vector<int64_t>(P));
      for (auto& row : counts)
        for (auto& c : row) c = trial == 0 ? 0 : std::uniform_int_distribution<int>(0, 3)(rng) * (rng() % 3 != 0);
      auto send_of = [&](int s) { return counts[s]; };
      auto recv_of = [&](int h) {
        std::vector<int64_t> recv;
        for (int s = 0; s < P; ++s) recv.push_back(counts[s][h]);
        return recv;
      };
      auto total = [](const std::vector<int64_t>& v) {
        int64_t t = 0;
        for (auto c : v) t += c;
        return t;
      };
      const int r = g->rank();
      check_against_reference(
          g, where + " trial " + std::to_string(trial),
          [&](int s) {
            return std::vector<int64_t>{total(send_of(s)), 2, 3};
          },
          [&](const Tensor& x) { return all_to_all_v(x, send_of(r), recv_of(r), g); },
          [&](const std::vector<Tensor>& xs, int h) {
            std::vector<Tensor> pieces;
            for (int s = 0; s < P; ++s) {
              int64_t offset = 0;
              for (int p = 0; p < h; ++p) offset += counts[s][p];
              pieces.push_back(xs[s].narrow(0, offset, counts[s][h]));
            }
            return at::cat(pieces, 0);
          });
    }
  });
}

TEST(MultiRank, AllGatherVUnevenAndZeroCountsMatchReference) {
  for_each_group([&](const GroupPtr& g, const std::string& where) {
    const int P = g->size();
    std::vector<std::vector<int64_t>> patterns = {std::vector<int64_t>(P, 0), std::vector<int64_t>(P, 2), {}, {}};
    for (int p = 0; p < P; ++p) patterns[2].push_back((p * 5 + 1) % 4);
    for (int p = 0; p < P; ++p) patterns[3].push_back(p == P - 1 ? 3 : 0);
    for (const auto& counts : patterns) {
      check_against_reference(
          g, where,
          [&](int s) {
            return std::vector<int64_t>{counts[s], 4};
          },
          [&](const Tensor& x) { return all_gather_v(x, counts, g); },
          [&](const std::vector<Tensor>& xs, int) { return at::cat(xs, 0); });
    }
  });
}

TEST(MultiRank, AllReduceMatchesReference) {
  for_each_group([&](const GroupPtr& g, const std::string& where) {
    check_against_reference(
        g, where,
        [&](int) {
          return std::vector<int64_t>{3, 5};
        },
        [&](const Tensor& x) { return all_reduce(x, g); },
        [&](const std::vector<Tensor>& xs, int) { return at::stack(xs).sum(0); });
  });
}

TEST(MultiRank, RingExchangeEveryOffsetMatchesReference) {
  for_each_group([&](const GroupPtr& g, const std::string& where) {
    const int P = g->size(), r = g->rank();
    for (int offset : {1, -1, 2, P + 1, P}) {
      // K and V of different shapes travel together; the loss weighs both.
      check_against_reference(
          g, where + " offset " + std::to_string(offset),
          [&](int) {
            return std::vector<int64_t>{5, 3};
          },
          [&](const Tensor& x) {
            auto got = ring_exchange({x.narrow(0, 0, 2), x.narrow(0, 2, 3) * 2}, g, offset);
            return at::cat({got[0], got[1]}, 0);
          },
          [&](const std::vector<Tensor>& xs, int h) {
            const Tensor& from = xs[((h - offset) % P + P) % P];
            return at::cat({from.narrow(0, 0, 2), from.narrow(0, 2, 3) * 2}, 0);
          });
      (void)r;
    }
  });
}

// The counters must show exactly the traffic the formulas of docs/runtime.md#communication-volumes predict.
TEST(MultiRank, ByteCountersMatchFormulas) {
  for_each_group([&](const GroupPtr& g, const std::string& where) {
    const int64_t P = g->size(), r = g->rank();
    const int64_t T = 4 * P, H = 2 * P, D = 8, b = 8;
    CommStats& stats = g->stats();
    auto fwd_bwd = [&](CommKind kind, const std::function<Tensor()>& run) {
      CommSnapshot before = stats.snapshot();
      run().sum().backward();
      CommSnapshot d = stats.snapshot() - before;
      return std::make_pair(d.at(kind, Pass::forward).bytes, d.at(kind, Pass::backward).bytes);
    };
    Tensor q = at::ones({T / P, H, D}, kF64).requires_grad_();
    auto [a2a_f, a2a_b] = fwd_bwd(CommKind::all_to_all, [&] { return all_to_all(q, 1, 0, g); });
    EXPECT_EQ(a2a_f, (P - 1) * (T / P) * (H / P) * D * b) << where;  // (U-1)/U · (T/S)·h·d·b
    EXPECT_EQ(a2a_b, a2a_f) << where;

    Tensor kv = at::ones({T / P, 2, D}, kF64).requires_grad_();
    auto [ring_f, ring_b] = fwd_bwd(CommKind::ring_exchange, [&] { return ring_exchange({kv}, g)[0]; });
    EXPECT_EQ(ring_f, P > 1 ? (T / P) * 2 * D * b : 0) << where;
    EXPECT_EQ(ring_b, ring_f) << where;

    std::vector<int64_t> send(P), recv(P);
    for (int64_t p = 0; p < P; ++p) send[p] = (r + p) % 3, recv[p] = (p + r) % 3;
    int64_t n = 0;
    for (auto c : send) n += c;
    Tensor rows = at::ones({n, D}, kF64).requires_grad_();
    auto [v_f, v_b] = fwd_bwd(CommKind::all_to_all_v, [&] { return all_to_all_v(rows, send, recv, g); });
    EXPECT_EQ(v_f, P > 1 ? (n - send[r]) * D * b : 0) << where;
    int64_t n_recv = 0;
    for (auto c : recv) n_recv += c;
    EXPECT_EQ(v_b, P > 1 ? (n_recv - recv[r]) * D * b : 0) << where;

    Tensor x = at::ones({6, D}, kF64).requires_grad_();
    auto [ar_f, ar_b] = fwd_bwd(CommKind::all_reduce, [&] { return all_reduce(x, g); });
    EXPECT_EQ(ar_f, 2 * (P - 1) * 6 * D * b / P) << where;
    EXPECT_EQ(ar_b, ar_f) << where;
  });
}

// Gloo has no bf16: data movement must still be bit-exact, sums done in fp32.
TEST(MultiRank, Bf16MovesBitExactAndSumsInFp32) {
  for_each_group([&](const GroupPtr& g, const std::string& where) {
    const int P = g->size(), r = g->rank();
    auto bf = [&](int s) { return input_of(s, {2 * P, P, 4}, 0.5).mul(100).to(at::kBFloat16); };
    Tensor y = all_to_all(bf(r), 1, 0, g);
    std::vector<Tensor> pieces;
    for (int s = 0; s < P; ++s) pieces.push_back(bf(s).chunk(P, 1)[r]);
    EXPECT_TRUE(y.equal(at::cat(pieces, 0))) << where;

    Tensor got = ring_exchange({bf(r)}, g)[0];
    EXPECT_TRUE(got.equal(bf((r + P - 1) % P))) << where;

    Tensor gathered = all_gather_v(bf(r).flatten(0, 1), std::vector<int64_t>(P, 2 * P * P), g);
    std::vector<Tensor> all;
    for (int s = 0; s < P; ++s) all.push_back(bf(s).flatten(0, 1));
    EXPECT_TRUE(gathered.equal(at::cat(all, 0))) << where;

    Tensor sum = all_reduce(bf(r), g);
    Tensor expected = at::zeros({2 * P, P, 4}, at::kFloat);
    for (int s = 0; s < P; ++s) expected += bf(s).to(at::kFloat);
    EXPECT_EQ(sum.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(sum.equal(P == 1 ? bf(r) : expected.to(at::kBFloat16))) << where;
  });
}

// Bad arguments fail on every rank before any message moves, and the group is
// still usable afterwards (nobody is left waiting in a half-started collective).
TEST(MultiRank, BadArgumentsFailBeforeTheCollective) {
  for_each_group([&](const GroupPtr& g, const std::string& where) {
    const int P = g->size();
    if (P == 1) return;
    EXPECT_THROW(all_to_all(at::ones({P + 1, 2}, kF64), 0, 1, g), Error) << where;
    EXPECT_THROW(all_to_all_v(at::ones({2, 2}, kF64), std::vector<int64_t>(P + 1, 0), std::vector<int64_t>(P, 0), g),
                 Error)
        << where;
    EXPECT_THROW(all_to_all_v(at::ones({5, 2}, kF64), std::vector<int64_t>(P, 1), std::vector<int64_t>(P, 1), g), Error)
        << where;
    EXPECT_THROW(all_gather_v(at::ones({1, 2}, kF64), std::vector<int64_t>(P, 2), g), Error) << where;
    EXPECT_THROW(all_reduce(at::ones({2}, at::kBool), g), Error) << where;
    Tensor ok = all_reduce(at::ones({2}, kF64), g);
    EXPECT_TRUE(ok.equal(at::full({2}, double(P), kF64))) << where;
  });
}
