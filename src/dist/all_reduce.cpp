// all_reduce (sum) and its autograd Function.
#include "mmsp/dist/all_reduce.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mmsp/core/check.h"

namespace mmsp::dist {
namespace {

at::Tensor summed(const at::Tensor& x, Group& group, Pass pass) {
  if (group.size() == 1) return x;
  if (group.stages(x)) return summed(x.cpu(), group, pass).to(x.device());
  const bool gloo = group.uses_gloo(x);
  const at::ScalarType type = x.scalar_type();
  const bool widen = gloo && type == at::kBFloat16;
  MMSP_CHECK(!gloo || widen || type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kInt ||
                 type == at::kLong || type == at::kChar || type == at::kByte,
             "all_reduce on group ", group.name(), ": Gloo cannot sum dtype ", type,
             " (use float, double, half, bfloat16 or an integer type of 8, 32 or 64 bits)");
  std::vector<at::Tensor> buffer{widen ? x.to(at::kFloat) : x.clone(at::MemoryFormat::Contiguous)};
  group.stats().add(CommKind::all_reduce, pass,
                    all_reduce_bytes(x.numel() * static_cast<int64_t>(x.element_size()), group.size()));
  group.wait(group.backend_for(x).allreduce(buffer), "all_reduce");
  return widen ? buffer[0].to(type) : buffer[0];
}

struct AllReduceFunction : torch::autograd::Function<AllReduceFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    ctx->saved_data["group"] = group_to_ivalue(group);
    return summed(x, *group, Pass::forward);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    GroupPtr group = group_from_ivalue(ctx->saved_data["group"]);
    return {summed(grads[0], *group, Pass::backward), at::Tensor()};
  }
};

}  // namespace

int64_t all_reduce_bytes(int64_t bytes, int group_size) { return 2 * (group_size - 1) * bytes / group_size; }

at::Tensor all_reduce(const at::Tensor& x, const GroupPtr& group) { return AllReduceFunction::apply(x, group); }

void all_reduce_(at::Tensor& x, Group& group) {
  MMSP_CHECK(x.is_contiguous() || group.size() == 1, "all_reduce_ needs a contiguous tensor");
  at::Tensor result = summed(x, group, Pass::forward);
  if (!result.is_same(x)) x.copy_(result);
}

}  // namespace mmsp::dist
