// all_to_all_v (rows with per-destination counts) and its autograd Function.
#include "mmsp/dist/all_to_all_v.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <c10/util/accumulate.h>

#include <numeric>

#include "mmsp/core/check.h"

namespace mmsp::dist {
namespace {

void check_counts(const char* what, const std::vector<int64_t>& counts, const Group& group) {
  MMSP_CHECK(static_cast<int>(counts.size()) == group.size(), "all_to_all_v on group ", group.name(), ": ", what,
             " has ", counts.size(), " entries, the group has ", group.size(), " ranks");
  for (size_t p = 0; p < counts.size(); ++p)
    MMSP_CHECK(counts[p] >= 0, "all_to_all_v on group ", group.name(), ": ", what, "[", p, "] = ", counts[p],
               " is negative");
}

}  // namespace

namespace detail {

at::Tensor all_to_all_v_raw(const at::Tensor& rows, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& recv_counts, Group& group, Pass pass, CommKind kind) {
  check_counts("send_counts", send_counts, group);
  check_counts("recv_counts", recv_counts, group);
  MMSP_CHECK(rows.dim() >= 1, "all_to_all_v needs rows of at least one dim");
  const int64_t total_send = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t total_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  MMSP_CHECK(rows.size(0) == total_send, "all_to_all_v on group ", group.name(), ": ", rows.size(0),
             " rows given but send_counts add up to ", total_send);
  const int me = group.rank();
  MMSP_CHECK(send_counts[me] == recv_counts[me], "all_to_all_v on group ", group.name(), ": rank ", me,
             " sends itself ", send_counts[me], " rows but expects ", recv_counts[me]);
  std::vector<int64_t> out_shape = rows.sizes().vec();
  out_shape[0] = total_recv;
  if (group.size() == 1) return rows;
  if (group.stages(rows))
    return all_to_all_v_raw(rows.cpu(), send_counts, recv_counts, group, pass, kind).to(rows.device());

  at::Tensor send = rows.contiguous();
  at::Tensor recv = at::empty(out_shape, rows.options());
  const int64_t row_bytes = c10::multiply_integers(rows.sizes().slice(1)) * rows.element_size();
  group.stats().add(kind, pass, (total_send - send_counts[me]) * row_bytes);
  const bool gloo = group.uses_gloo(rows);
  at::Tensor send_wire = wire_view(send, gloo), recv_wire = wire_view(recv, gloo);
  std::vector<int64_t> out_splits = recv_counts, in_splits = send_counts;
  group.wait(group.backend_for(rows).alltoall_base(recv_wire, send_wire, out_splits, in_splits), comm_kind_name(kind));
  return recv;
}

}  // namespace detail

namespace {

struct AllToAllVFunction : torch::autograd::Function<AllToAllVFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows,
                            const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts,
                            const GroupPtr& group) {
    ctx->saved_data["group"] = group_to_ivalue(group);
    ctx->saved_data["send"] = send_counts;
    ctx->saved_data["recv"] = recv_counts;
    return detail::all_to_all_v_raw(rows, send_counts, recv_counts, *group, Pass::forward);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    GroupPtr group = group_from_ivalue(ctx->saved_data["group"]);
    at::Tensor drows = detail::all_to_all_v_raw(grads[0], ctx->saved_data["recv"].toIntVector(),
                                                ctx->saved_data["send"].toIntVector(), *group, Pass::backward);
    return {drows, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_v(const at::Tensor& rows, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts, const GroupPtr& group) {
  return AllToAllVFunction::apply(rows, send_counts, recv_counts, group);
}

}  // namespace mmsp::dist
