// all_to_all (scatter one dim, gather another) and its autograd Function.
#include "mmsp/dist/all_to_all.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mmsp/core/check.h"

namespace mmsp::dist {
namespace detail {

at::Tensor all_to_all_raw(const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim, Group& group, Pass pass) {
  const int64_t P = group.size();
  if (P == 1) return x;
  if (group.stages(x)) return all_to_all_raw(x.cpu(), scatter_dim, gather_dim, group, pass).to(x.device());
  const int64_t S = x.size(scatter_dim);
  MMSP_CHECK(S % P == 0, "all_to_all on group ", group.name(), ": dim ", scatter_dim, " of size ", S,
             " must divide by the group size ", P);
  // x [.., S, ..] -> send [P, .., S/P, ..]: piece p is contiguous for rank p.
  std::vector<int64_t> split = x.sizes().vec();
  split[scatter_dim] = S / P;
  split.insert(split.begin() + scatter_dim, P);
  at::Tensor send = x.reshape(split).movedim(scatter_dim, 0).contiguous();
  at::Tensor recv = at::empty_like(send);
  const bool gloo = group.uses_gloo(x);
  at::Tensor send_wire = wire_view(send, gloo), recv_wire = wire_view(recv, gloo);
  std::vector<int64_t> equal_splits;  // empty = equal pieces
  group.stats().add(CommKind::all_to_all, pass, all_to_all_bytes(x, static_cast<int>(P)));
  group.wait(group.backend_for(x).alltoall_base(recv_wire, send_wire, equal_splits, equal_splits), "all_to_all");
  // recv [P, .., S/P, ..] (piece from rank p first) -> join along gather_dim.
  at::Tensor joined = recv.movedim(0, gather_dim);  // [.., P, G, ..] at gather_dim
  std::vector<int64_t> out = joined.sizes().vec();
  out[gather_dim] *= out[gather_dim + 1];
  out.erase(out.begin() + gather_dim + 1);
  return joined.reshape(out);
}

}  // namespace detail

namespace {

struct AllToAllFunction : torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t scatter_dim,
                            int64_t gather_dim, const GroupPtr& group) {
    ctx->saved_data["group"] = group_to_ivalue(group);
    ctx->saved_data["scatter_dim"] = scatter_dim;
    ctx->saved_data["gather_dim"] = gather_dim;
    return detail::all_to_all_raw(x, scatter_dim, gather_dim, *group, Pass::forward);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    GroupPtr group = group_from_ivalue(ctx->saved_data["group"]);
    at::Tensor dx = detail::all_to_all_raw(grads[0], ctx->saved_data["gather_dim"].toInt(),
                                           ctx->saved_data["scatter_dim"].toInt(), *group, Pass::backward);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t all_to_all_bytes(const at::Tensor& x, int group_size) {
  return x.numel() / group_size * (group_size - 1) * static_cast<int64_t>(x.element_size());
}

at::Tensor all_to_all(const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim, const GroupPtr& group) {
  MMSP_CHECK(x.dim() > 0, "all_to_all needs a tensor with at least one dim");
  scatter_dim = at::maybe_wrap_dim(scatter_dim, x.dim());
  gather_dim = at::maybe_wrap_dim(gather_dim, x.dim());
  return AllToAllFunction::apply(x, scatter_dim, gather_dim, group);
}

}  // namespace mmsp::dist
