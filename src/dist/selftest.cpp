// Collective self-test; see selftest.h. Values are small integers and dyadic
// fractions in fp64, so every expected value is exact and errors must be 0.
#include "mmsp/dist/selftest.h"

#include <ATen/ATen.h>

#include <functional>

#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/all_to_all.h"
#include "mmsp/dist/all_to_all_v.h"
#include "mmsp/dist/ring_exchange.h"

namespace mmsp::dist {
namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);
// Where the collectives' inputs live (--device of `mmsp selftest`): the expected values are
// made on the host, the inputs and weights moved here, the results compared on the host.
thread_local at::Device input_device = at::kCPU;

// The value rank a puts at (b, c, d), and the loss weight of element (b, c, d) on rank a.
double enc(int a, int64_t b, int64_t c, int64_t d) { return a * 1000.0 + b * 100 + c * 10 + d; }
double weight(int a, int64_t b, int64_t c, int64_t d) { return 1 + a + 0.5 * b + 0.25 * c + 0.125 * d; }

at::Tensor tensor3(int64_t n0, int64_t n1, int64_t n2, const std::function<double(int64_t, int64_t, int64_t)>& f) {
  at::Tensor t = at::empty({n0, n1, n2}, kF64);
  auto a = t.accessor<double, 3>();
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j)
      for (int64_t k = 0; k < n2; ++k) a[i][j][k] = f(i, j, k);
  return t;
}

double max_error(const at::Tensor& got, const at::Tensor& expected) {
  if (!got.defined() || got.sizes() != expected.sizes()) return INFINITY;
  if (got.numel() == 0) return 0;
  return (got.cpu() - expected).abs().max().item<double>();
}

struct Case {
  at::Tensor out, expected_out, grad, expected_grad;
};

// Ulysses-shaped: x [2P tokens, P heads, 2], scatter heads, gather tokens.
// Rank g gets y[s*2P + t, 0, d] = x_s[t, g, d].
Case all_to_all_case(const GroupPtr& group) {
  const int P = group->size(), g = group->rank();
  const int64_t T = 2 * P;
  at::Tensor x =
      tensor3(T, P, 2, [&](auto t, auto h, auto d) { return enc(g, t, h, d); }).to(input_device).requires_grad_();
  at::Tensor y = all_to_all(x, /*scatter_dim=*/1, /*gather_dim=*/0, group);
  at::Tensor w = tensor3(P * T, 1, 2, [&](auto t, auto, auto d) { return weight(g, t, 0, d); });
  (y * w.to(y.device())).sum().backward();
  return {y, tensor3(P * T, 1, 2, [&](auto st, auto, auto d) { return enc(st / T, st % T, g, d); }), x.grad(),
          tensor3(T, P, 2, [&](auto t, auto h, auto d) { return weight(h, g * T + t, 0, d); })};
}

// Rank g sends (g + 2p) % 3 rows to rank p (zero counts included); row k for p
// holds enc(g, p, k, d).
int64_t a2av_count(int from, int to) { return (from + 2 * to) % 3; }

Case all_to_all_v_case(const GroupPtr& group) {
  const int P = group->size(), g = group->rank();
  std::vector<int64_t> send(P), recv(P);
  std::vector<at::Tensor> rows, expected_rows, w, expected_grad;
  for (int p = 0; p < P; ++p) {
    send[p] = a2av_count(g, p);
    recv[p] = a2av_count(p, g);
    rows.push_back(tensor3(send[p], 1, 2, [&](auto k, auto, auto d) { return enc(g, p, k, d); }));
    expected_rows.push_back(tensor3(recv[p], 1, 2, [&](auto k, auto, auto d) { return enc(p, g, k, d); }));
    w.push_back(tensor3(recv[p], 1, 2, [&](auto k, auto, auto d) { return weight(g, p, k, d); }));
    expected_grad.push_back(tensor3(send[p], 1, 2, [&](auto k, auto, auto d) { return weight(p, g, k, d); }));
  }
  at::Tensor x = at::cat(rows).to(input_device).requires_grad_();
  at::Tensor y = all_to_all_v(x, send, recv, group);
  (y * at::cat(w).to(y.device())).sum().backward();
  return {y, at::cat(expected_rows), x.grad(), at::cat(expected_grad)};
}

// Rank p holds p % 3 rows (rank 0 none); everyone gets all rows in rank order.
Case all_gather_v_case(const GroupPtr& group) {
  const int P = group->size(), g = group->rank();
  std::vector<int64_t> counts(P);
  std::vector<at::Tensor> expected_rows, w;
  for (int p = 0; p < P; ++p) {
    counts[p] = p % 3;
    expected_rows.push_back(tensor3(counts[p], 1, 2, [&](auto k, auto, auto d) { return enc(p, 0, k, d); }));
    w.push_back(tensor3(counts[p], 1, 2, [&](auto k, auto, auto d) { return weight(g, p, k, d); }));
  }
  at::Tensor x =
      tensor3(counts[g], 1, 2, [&](auto k, auto, auto d) { return enc(g, 0, k, d); }).to(input_device).requires_grad_();
  at::Tensor y = all_gather_v(x, counts, group);
  (y * at::cat(w).to(y.device())).sum().backward();
  at::Tensor grad = tensor3(counts[g], 1, 2, [&](auto k, auto, auto d) {
    double sum = 0;
    for (int h = 0; h < P; ++h) sum += weight(h, g, k, d);
    return sum;
  });
  return {y, at::cat(expected_rows), x.grad(), grad};
}

Case all_reduce_case(const GroupPtr& group) {
  const int P = group->size(), g = group->rank();
  auto sum_over_ranks = [&](const std::function<double(int, int64_t, int64_t)>& f) {
    return tensor3(3, 1, 2, [&](auto i, auto, auto d) {
      double sum = 0;
      for (int s = 0; s < P; ++s) sum += f(s, i, d);
      return sum;
    });
  };
  at::Tensor x =
      tensor3(3, 1, 2, [&](auto i, auto, auto d) { return enc(g, i, 0, d); }).to(input_device).requires_grad_();
  at::Tensor y = all_reduce(x, group);
  (y * tensor3(3, 1, 2, [&](auto i, auto, auto d) { return weight(g, i, 0, d); }).to(y.device())).sum().backward();
  return {y, sum_over_ranks([](int s, int64_t i, int64_t d) { return enc(s, i, 0, d); }), x.grad(),
          sum_over_ranks([](int s, int64_t i, int64_t d) { return weight(s, i, 0, d); })};
}

// Two tensors of different shapes in one exchange, as ring attention sends K and V.
Case ring_exchange_case(const GroupPtr& group) {
  const int P = group->size(), g = group->rank();
  const int prev = (g + P - 1) % P, next = (g + 1) % P;
  at::Tensor k =
      tensor3(2, 3, 1, [&](auto i, auto j, auto) { return enc(g, i, j, 0); }).to(input_device).requires_grad_();
  at::Tensor v =
      tensor3(1, 2, 2, [&](auto i, auto j, auto d) { return enc(g, i, j, d) + 0.5; }).to(input_device).requires_grad_();
  auto got = ring_exchange({k, v}, group, 1);
  auto wk = [](int r) { return tensor3(2, 3, 1, [&](auto i, auto j, auto) { return weight(r, i, j, 0); }); };
  auto wv = [](int r) { return tensor3(1, 2, 2, [&](auto i, auto j, auto d) { return weight(r, i, j, d); }); };
  ((got[0] * wk(g).to(got[0].device())).sum() + (got[1] * wv(g).to(got[1].device())).sum()).backward();
  at::Tensor expected_k = tensor3(2, 3, 1, [&](auto i, auto j, auto) { return enc(prev, i, j, 0); });
  at::Tensor expected_v = tensor3(1, 2, 2, [&](auto i, auto j, auto d) { return enc(prev, i, j, d) + 0.5; });
  return {at::cat({got[0].flatten(), got[1].flatten()}), at::cat({expected_k.flatten(), expected_v.flatten()}),
          at::cat({k.grad().flatten(), v.grad().flatten()}), at::cat({wk(next).flatten(), wv(next).flatten()})};
}

}  // namespace

std::vector<SelftestResult> run_selftest(const Mesh& mesh, const at::Device& device) {
  input_device = device;
  const std::pair<const char*, Case (*)(const GroupPtr&)> cases[] = {{"all_to_all", all_to_all_case},
                                                                     {"all_to_all_v", all_to_all_v_case},
                                                                     {"all_gather_v", all_gather_v_case},
                                                                     {"all_reduce", all_reduce_case},
                                                                     {"ring_exchange", ring_exchange_case}};
  std::vector<SelftestResult> results;
  for (const plan::AxisSpec& axis : plan::mesh_axes()) {
    // expert 1: the folded axes are a one-rank group and the world's again
    if (axis.kind == plan::AxisKind::folded && mesh.shape().expert == 1) continue;
    const GroupPtr& group = mesh.group(axis.axis);
    for (const auto& [name, run] : cases) {
      const CommSnapshot before = mesh.stats().snapshot();
      Case c = run(group);
      SelftestResult r;
      r.collective = name;
      r.group = group->name();
      r.group_size = group->size();
      r.bytes_sent = (mesh.stats().snapshot() - before).total_bytes();
      r.forward_error = max_error(c.out, c.expected_out);
      r.backward_error = max_error(c.grad, c.expected_grad);
      results.push_back(r);
    }
  }
  return results;
}

}  // namespace mmsp::dist
