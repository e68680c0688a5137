// Identity autograd functions that mark a phase's backward; see phase_marker.h.
#include "mmsp/model/phase_marker.h"

#include <torch/csrc/autograd/custom_function.h>

namespace mmsp::model {
namespace {

template <bool Enter>
struct PhaseMarker : torch::autograd::Function<PhaseMarker<Enter>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t phase) {
    ctx->saved_data["phase"] = phase;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto phase = static_cast<Phase>(ctx->saved_data["phase"].toInt());
    if (Enter)
      phase_enter(phase);
    else
      phase_leave(phase);
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

at::Tensor enter_phase_in_backward(const at::Tensor& x, Phase phase) {
  if (!x.requires_grad()) return x;
  return PhaseMarker<true>::apply(x, static_cast<int64_t>(phase));
}

at::Tensor leave_phase_in_backward(const at::Tensor& x, Phase phase) {
  if (!x.requires_grad()) return x;
  return PhaseMarker<false>::apply(x, static_cast<int64_t>(phase));
}

}  // namespace mmsp::model
