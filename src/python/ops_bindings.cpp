// mmsp's sequence-parallel ops on torch tensors: attention over the context group (local,
// Ulysses, zigzag ring or both), and the pieces of Gated DeltaNet under sequence
// parallelism (its causal conv and its rule with ring state passing, Ulysses' head
// exchange). Each is LibTorch autograd: called from Python, its backward runs in the same
// autograd engine and makes the same collectives, mirrored. The GIL is released while an
// op runs (its collectives block); every check comes before the first collective.
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "bindings.h"
#include "mmsp/attention/context_attention.h"
#include "mmsp/attention/linear/gated_delta_context.h"
#include "mmsp/attention/linear/gated_delta_ring.h"
#include "mmsp/attention/step_attention.h"
#include "mmsp/attention/ulysses_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/all_to_all_v.h"

namespace mmsp::python {

namespace {

using attention::TokenLayout;

// Every ring rank's share as (segment, order) pairs -> layouts, checked.
std::vector<TokenLayout> layouts(const std::vector<at::Tensor>& segments, const std::vector<at::Tensor>& orders,
                                 const char* what) {
  MMSP_CHECK(!segments.empty() && segments.size() == orders.size(), what, ": ", segments.size(), " segment and ",
             orders.size(), " order tensors; give one of each per ring rank's share");
  std::vector<TokenLayout> out;
  for (size_t p = 0; p < segments.size(); ++p) {
    TokenLayout l{segments[p], orders[p]};
    l.check(what);
    out.push_back(l);
  }
  return out;
}

// An axis not given is a one-member group (its collectives are identities).
dist::GroupPtr group_or_solo(const std::optional<c10::intrusive_ptr<dist::Group>>& g, const char* axis) {
  return g && *g ? *g : dist::make_solo_group(axis, 0);
}

int size_of(const dist::GroupPtr& g) { return g ? g->size() : 1; }
int rank_of(const dist::GroupPtr& g) { return g ? g->rank() : 0; }

// The tensors must be where the group can move them (Gloo: CPU; NCCL: CUDA), all on one device.
void check_devices(const std::vector<at::Tensor>& tensors, const std::vector<dist::GroupPtr>& groups,
                   const char* what) {
  const at::Device device = tensors.front().device();
  for (const at::Tensor& t : tensors)
    MMSP_CHECK(t.device() == device, what, ": tensors on ", device.str(), " and ", t.device().str(),
               "; put every input on one device");
  for (const dist::GroupPtr& g : groups)
    if (g && g->size() > 1) (void)g->backend_for(tensors.front());  // names the group and the device
}

at::Tensor context_attention_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::vector<at::Tensor>& segments, const std::vector<at::Tensor>& orders,
                                const std::optional<c10::intrusive_ptr<dist::Group>>& ring_group,
                                const std::optional<c10::intrusive_ptr<dist::Group>>& ulysses_group, bool causal,
                                double scale, const std::vector<int64_t>& split_slots) {
  const dist::GroupPtr ring = group_or_solo(ring_group, "ring"), ulysses = group_or_solo(ulysses_group, "ulysses");
  check_devices({q, k, v}, {ring, ulysses}, "mmsp.ops.attention");
  MMSP_CHECK(static_cast<int>(segments.size()) == size_of(ring), "mmsp.ops.attention: ", segments.size(),
             " ring shares for a ring group of ", size_of(ring), " ranks; give every ring rank's share");
  attention::AttentionOptions options;
  options.causal = causal;
  options.scale = scale;
  py::gil_scoped_release no_gil;
  return attention::context_attention(q, k, v, {ring, ulysses}, layouts(segments, orders, "mmsp.ops.attention"),
                                      options, split_slots);
}

// The step's attention of one op call, planned (the op's forward and its backward each plan it:
// pure index work, no collective).
std::shared_ptr<const attention::StepAttention> planned_step(const at::Tensor& q,
                                                             const std::vector<at::Tensor>& segments,
                                                             const std::vector<at::Tensor>& orders,
                                                             const dist::GroupPtr& ring, const dist::GroupPtr& ulysses,
                                                             bool causal, double scale,
                                                             const std::vector<int64_t>& split_slots) {
  MMSP_CHECK(static_cast<int>(segments.size()) == size_of(ring), "mmsp.ops.attention: ", segments.size(),
             " ring shares for a ring group of ", size_of(ring), " ranks; give every ring rank's share");
  attention::AttentionOptions options;
  options.causal = causal;
  options.scale = scale;
  return attention::plan_step_attention({ring, ulysses}, layouts(segments, orders, "mmsp.ops.attention"), options,
                                        q.device(), std::nullopt, split_slots);
}

// The op's forward: [out, what its backward reads...] (step_attention.h).
std::vector<at::Tensor> context_attention_forward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::vector<at::Tensor>& segments,
    const std::vector<at::Tensor>& orders, const std::optional<c10::intrusive_ptr<dist::Group>>& ring_group,
    const std::optional<c10::intrusive_ptr<dist::Group>>& ulysses_group, bool causal, double scale,
    const std::vector<int64_t>& split_slots) {
  const dist::GroupPtr ring = group_or_solo(ring_group, "ring"), ulysses = group_or_solo(ulysses_group, "ulysses");
  check_devices({q, k, v}, {ring, ulysses}, "mmsp.ops.attention");
  attention::check_attention_inputs(q, k, v, "mmsp.ops.attention");
  const auto step = planned_step(q, segments, orders, ring, ulysses, causal, scale, split_slots);
  py::gil_scoped_release no_gil;
  attention::AttentionForward f = attention::step_attention_forward(*step, q, k, v);
  // A custom op's outputs may not alias its inputs or each other: a saved tensor that is an
  // input (one Ulysses rank: the gathered q is q) or the output is copied.
  auto shares = [](const at::Tensor& a, const at::Tensor& b) {
    return a.numel() > 0 && b.numel() > 0 && a.storage().is_alias_of(b.storage());
  };
  std::vector<at::Tensor> out{f.out.contiguous()};
  for (const at::Tensor& t : f.saved) {
    const bool aliased = shares(t, q) || shares(t, k) || shares(t, v) || shares(t, out.front());
    out.push_back(aliased ? t.clone(at::MemoryFormat::Contiguous) : t.contiguous());
  }
  return out;
}

// The op's backward from the forward's saved tensors: [dq, dk, dv]; runs no forward.
std::vector<at::Tensor> context_attention_backward_op(
    const at::Tensor& dout, const std::vector<at::Tensor>& saved, int64_t kv_heads,
    const std::vector<at::Tensor>& segments, const std::vector<at::Tensor>& orders,
    const std::optional<c10::intrusive_ptr<dist::Group>>& ring_group,
    const std::optional<c10::intrusive_ptr<dist::Group>>& ulysses_group, bool causal, double scale,
    const std::vector<int64_t>& split_slots) {
  const dist::GroupPtr ring = group_or_solo(ring_group, "ring"), ulysses = group_or_solo(ulysses_group, "ulysses");
  const auto step = planned_step(dout, segments, orders, ring, ulysses, causal, scale, split_slots);
  MMSP_CHECK(saved.size() == (step->mixed() ? 10u : 5u), "mmsp.ops.attention's backward: ", saved.size(),
             " saved tensors, not the forward's");
  py::gil_scoped_release no_gil;
  attention::AttentionGrads g = attention::step_attention_backward(*step, dout.contiguous(), saved, kv_heads);
  return {g.dq.contiguous(), g.dk.contiguous(), g.dv.contiguous()};
}

attention::RingRunIndex ring_index(const std::vector<at::Tensor>& segments, const std::vector<at::Tensor>& orders,
                                   const dist::GroupPtr& ring, int64_t conv_kernel, int64_t chunk,
                                   const at::Device& device, const char* what) {
  MMSP_CHECK(static_cast<int>(segments.size()) == size_of(ring), what, ": ", segments.size(),
             " ring shares for a ring group of ", size_of(ring), " ranks; give every ring rank's share");
  MMSP_CHECK(chunk > 0 && conv_kernel > 0, what, ": chunk ", chunk, " and conv kernel ", conv_kernel,
             " must be positive");
  return attention::RingRunIndex::make(layouts(segments, orders, what), rank_of(ring), conv_kernel, chunk, device);
}

at::Tensor gated_delta_conv_op(const at::Tensor& x, const at::Tensor& weight, const std::vector<at::Tensor>& segments,
                               const std::vector<at::Tensor>& orders,
                               const std::optional<c10::intrusive_ptr<dist::Group>>& ring_group) {
  const dist::GroupPtr ring = group_or_solo(ring_group, "ring");
  check_devices({x, weight}, {ring}, "mmsp.ops.gated_delta_conv");
  MMSP_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.size(0) == x.size(1), "mmsp.ops.gated_delta_conv: x ",
             x.sizes(), " must be [T, C] and weight ", weight.sizes(), " [C, W]");
  const auto index = ring_index(segments, orders, ring, weight.size(1), 64, x.device(), "mmsp.ops.gated_delta_conv");
  MMSP_CHECK(index.tokens == x.size(0), "mmsp.ops.gated_delta_conv: x has ", x.size(0),
             " tokens but this ring rank's share has ", index.tokens);
  py::gil_scoped_release no_gil;
  return attention::gated_delta_conv(x, weight, index, ring);
}

at::Tensor gated_delta_rule_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                               const at::Tensor& beta, const std::vector<at::Tensor>& segments,
                               const std::vector<at::Tensor>& orders,
                               const std::optional<c10::intrusive_ptr<dist::Group>>& ring_group, int64_t chunk) {
  const dist::GroupPtr ring = group_or_solo(ring_group, "ring");
  check_devices({q, k, v, g, beta}, {ring}, "mmsp.ops.gated_delta_rule");
  MMSP_CHECK(q.dim() == 3 && k.sizes() == q.sizes() && v.dim() == 3 && v.size(0) == q.size(0) &&
                 v.size(1) == q.size(1) && g.sizes() == q.sizes().slice(0, 2) && beta.sizes() == g.sizes(),
             "mmsp.ops.gated_delta_rule: q ", q.sizes(), ", k ", k.sizes(), " must be [T, H, K], v ", v.sizes(),
             " [T, H, V], g ", g.sizes(), " and beta ", beta.sizes(), " [T, H]");
  const auto index = ring_index(segments, orders, ring, 1, chunk, q.device(), "mmsp.ops.gated_delta_rule");
  MMSP_CHECK(index.tokens == q.size(0), "mmsp.ops.gated_delta_rule: q has ", q.size(0),
             " tokens but this ring rank's share has ", index.tokens);
  py::gil_scoped_release no_gil;
  return attention::gated_delta_ring_rule(q, k, v, g, beta, index, ring);
}

at::Tensor scatter_heads_op(const at::Tensor& x, const std::vector<int64_t>& tokens,
                            const c10::intrusive_ptr<dist::Group>& ulysses) {
  check_devices({x}, {ulysses}, "mmsp.ops.ulysses_scatter_heads");
  py::gil_scoped_release no_gil;
  return attention::ulysses_scatter_heads(x, tokens, ulysses);
}

at::Tensor gather_heads_op(const at::Tensor& y, const std::vector<int64_t>& tokens,
                           const c10::intrusive_ptr<dist::Group>& ulysses) {
  check_devices({y}, {ulysses}, "mmsp.ops.ulysses_gather_heads");
  py::gil_scoped_release no_gil;
  return attention::ulysses_gather_heads(y, tokens, ulysses);
}

// Rows to the ranks of a group by per-rank counts (Vision DP's routes); differentiable.
at::Tensor all_to_all_v_op(const at::Tensor& rows, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts, const c10::intrusive_ptr<dist::Group>& group) {
  check_devices({rows}, {group}, "mmsp.ops.all_to_all_v");
  const size_t P = static_cast<size_t>(group->size());
  MMSP_CHECK(send_counts.size() == P && recv_counts.size() == P, "mmsp.ops.all_to_all_v: ", send_counts.size(),
             " send and ", recv_counts.size(), " receive counts for a group of ", P);
  int64_t sent = 0;
  for (int64_t c : send_counts) sent += c;
  MMSP_CHECK(rows.dim() >= 1 && rows.size(0) == sent, "mmsp.ops.all_to_all_v: ", rows.dim() ? rows.size(0) : 0,
             " rows for send counts summing to ", sent);
  py::gil_scoped_release no_gil;
  return dist::all_to_all_v(rows, send_counts, recv_counts, group);
}

// A sum over a group, in place (the patch's loss and gradient sums, the batch fingerprints):
// mmsp's collective, so the group's timeout bounds it and a failure names the group.
void all_reduce_op(at::Tensor x, const c10::intrusive_ptr<dist::Group>& group) {
  check_devices({x}, {group}, "mmsp all_reduce");
  MMSP_CHECK(x.is_contiguous(), "mmsp all_reduce on group ", group->name(), ": the tensor ", x.sizes(),
             " must be contiguous (it is summed in place)");
  py::gil_scoped_release no_gil;
  dist::all_reduce_(x, *group);
}

}  // namespace

void bind_ops(py::module_& m) {
  m.def("context_attention", &context_attention_op, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("segments"),
        py::arg("orders"), py::arg("ring") = py::none(), py::arg("ulysses") = py::none(), py::arg("causal") = true,
        py::arg("scale") = 0.0, py::arg("split_slots") = std::vector<int64_t>{});
  m.def("context_attention_forward", &context_attention_forward_op, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("segments"), py::arg("orders"), py::arg("ring") = py::none(), py::arg("ulysses") = py::none(),
        py::arg("causal") = true, py::arg("scale") = 0.0, py::arg("split_slots") = std::vector<int64_t>{});
  m.def("context_attention_backward", &context_attention_backward_op, py::arg("dout"), py::arg("saved"),
        py::arg("kv_heads"), py::arg("segments"), py::arg("orders"), py::arg("ring") = py::none(),
        py::arg("ulysses") = py::none(), py::arg("causal") = true, py::arg("scale") = 0.0,
        py::arg("split_slots") = std::vector<int64_t>{});
  m.def("gated_delta_conv", &gated_delta_conv_op, py::arg("x"), py::arg("weight"), py::arg("segments"),
        py::arg("orders"), py::arg("ring") = py::none());
  m.def("gated_delta_rule", &gated_delta_rule_op, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"),
        py::arg("beta"), py::arg("segments"), py::arg("orders"), py::arg("ring") = py::none(), py::arg("chunk") = 64);
  m.def("ulysses_scatter_heads", &scatter_heads_op, py::arg("x"), py::arg("tokens"), py::arg("ulysses"));
  m.def("ulysses_gather_heads", &gather_heads_op, py::arg("y"), py::arg("tokens"), py::arg("ulysses"));
  m.def("all_to_all_v", &all_to_all_v_op, py::arg("rows"), py::arg("send_counts"), py::arg("recv_counts"),
        py::arg("group"));
  m.def("all_reduce_", &all_reduce_op, py::arg("x"), py::arg("group"));
  m.def("check_ulysses_heads", &attention::check_ulysses_heads, py::arg("heads"), py::arg("kv_heads"),
        py::arg("ulysses"));
  m.def("check_gated_delta_heads", &attention::check_gated_delta_heads, py::arg("key_heads"), py::arg("value_heads"),
        py::arg("ulysses"));
}

}  // namespace mmsp::python
