// all_gather_v and its autograd Function. Gloo's all-gather wants equal pieces, so
// rows are padded to the largest count (as the Python Vision DP patches do).
#include "mmsp/dist/all_gather_v.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_to_all_v.h"

namespace mmsp::dist {
namespace {

void check_counts(const at::Tensor& rows, const std::vector<int64_t>& counts, const Group& group) {
  MMSP_CHECK(static_cast<int>(counts.size()) == group.size(), "all_gather_v on group ", group.name(), ": counts has ",
             counts.size(), " entries, the group has ", group.size(), " ranks");
  for (size_t p = 0; p < counts.size(); ++p)
    MMSP_CHECK(counts[p] >= 0, "all_gather_v on group ", group.name(), ": counts[", p, "] = ", counts[p],
               " is negative");
  MMSP_CHECK(rows.dim() >= 1 && rows.size(0) == counts[group.rank()], "all_gather_v on group ", group.name(), ": rank ",
             group.rank(), " passes ", rows.dim() ? rows.size(0) : 0, " rows but counts[", group.rank(),
             "] = ", counts[group.rank()]);
}

at::Tensor all_gather_v_forward(const at::Tensor& rows, const std::vector<int64_t>& counts, Group& group) {
  const int P = group.size();
  if (P == 1) return rows;
  if (group.stages(rows)) return all_gather_v_forward(rows.cpu(), counts, group).to(rows.device());
  const int64_t max_count = *std::max_element(counts.begin(), counts.end());
  std::vector<int64_t> out_shape = rows.sizes().vec();
  out_shape[0] = c10::sum_integers(counts);
  if (max_count == 0) return at::empty(out_shape, rows.options());  // every rank agrees

  std::vector<int64_t> padded_shape = rows.sizes().vec();
  padded_shape[0] = max_count;
  at::Tensor padded = at::zeros(padded_shape, rows.options());
  padded.narrow(0, 0, rows.size(0)).copy_(rows);
  const bool gloo = group.uses_gloo(rows);
  std::vector<at::Tensor> inputs{wire_view(padded, gloo)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  std::vector<at::Tensor> pieces;
  for (int p = 0; p < P; ++p) {
    pieces.push_back(at::empty(padded_shape, rows.options()));
    outputs[0].push_back(wire_view(pieces.back(), gloo));
  }
  group.stats().add(CommKind::all_gather_v, Pass::forward,
                    (P - 1) * padded.numel() * static_cast<int64_t>(padded.element_size()));
  group.wait(group.backend_for(rows).allgather(outputs, inputs), "all_gather_v");
  for (int p = 0; p < P; ++p) pieces[p] = pieces[p].narrow(0, 0, counts[p]);
  return at::cat(pieces, 0);
}

struct AllGatherVFunction : torch::autograd::Function<AllGatherVFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows,
                            const std::vector<int64_t>& counts, const GroupPtr& group) {
    ctx->saved_data["group"] = group_to_ivalue(group);
    ctx->saved_data["counts"] = counts;
    return all_gather_v_forward(rows, counts, *group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    GroupPtr group = group_from_ivalue(ctx->saved_data["group"]);
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const int P = group->size();
    if (P == 1) return {grads[0], at::Tensor(), at::Tensor()};
    // Slice p of every rank's gradient goes to rank p, which sums the P copies.
    const int64_t mine = counts[group->rank()];
    std::vector<int64_t> recv(P, mine);
    at::Tensor copies =
        detail::all_to_all_v_raw(grads[0], counts, recv, *group, Pass::backward, CommKind::all_gather_v);
    std::vector<int64_t> stacked = copies.sizes().vec();
    stacked[0] = mine;
    stacked.insert(stacked.begin(), P);
    return {copies.reshape(stacked).sum(0), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_gather_v(const at::Tensor& rows, const std::vector<int64_t>& counts, const GroupPtr& group) {
  check_counts(rows, counts, *group);
  return AllGatherVFunction::apply(rows, counts, group);
}

}  // namespace mmsp::dist
