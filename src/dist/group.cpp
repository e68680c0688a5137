// Group: backend choice per device, error translation, wire dtypes; see group.h.
#include "mmsp/dist/group.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/core/phase_timer.h"

namespace mmsp::dist {

Group::Group(std::string name, std::vector<int> members, int rank, c10::intrusive_ptr<Backend> cpu,
             c10::intrusive_ptr<Backend> gpu, std::shared_ptr<CommStats> stats, std::chrono::milliseconds timeout,
             bool stage_cuda_through_host)
    : name_(std::move(name)),
      members_(std::move(members)),
      rank_(rank),
      cpu_(std::move(cpu)),
      gpu_(std::move(gpu)),
      stats_(std::move(stats)),
      timeout_(timeout),
      stage_(stage_cuda_through_host) {
  MMSP_ASSERT(rank_ >= 0 && rank_ < size(), "group ", name_, " rank ", rank_);
  MMSP_ASSERT(size() == 1 || cpu_, "group ", name_, " of size ", size(), " has no backend");
}

Backend& Group::backend_for(const at::Tensor& tensor) const {
  if (tensor.device().is_cpu()) return *cpu_;
  MMSP_CHECK(tensor.device().is_cuda() && gpu_, "group ", name_, " cannot move tensors on ", tensor.device().str(),
             ": it has no NCCL backend (ranks on --device cpu, or a LibTorch without NCCL; "
             "CPU tensors use Gloo)");
  return *gpu_;
}

bool Group::uses_gloo(const at::Tensor& tensor) const { return tensor.device().is_cpu(); }

void Group::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* collective) const {
  PhaseScope communication(Phase::communication);
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw Error(detail::concat(collective, " on group ", name_, " (", size(),
                               " ranks) failed: a peer rank died, hung or disagreed on the call (timeout ",
                               timeout_.count() / 1000.0, " s). Backend said: ", e.what()));
  }
}

GroupPtr make_solo_group(const std::string& name, int global_rank, std::shared_ptr<CommStats> stats) {
  return c10::make_intrusive<Group>(name, std::vector<int>{global_rank}, 0, c10::intrusive_ptr<Backend>(),
                                    c10::intrusive_ptr<Backend>(), std::move(stats), std::chrono::milliseconds(0));
}

GroupPtr group_from_ivalue(const at::IValue& value) {
  auto holder = value.toCapsule();
  auto* group = dynamic_cast<Group*>(holder.get());
  MMSP_ASSERT(group != nullptr, "saved capsule is not a Group");
  return GroupPtr::unsafe_reclaim_from_nonowning(group);
}

at::Tensor wire_view(const at::Tensor& tensor, bool gloo) {
  if (!gloo) return tensor;
  switch (tensor.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kInt:
    case at::kLong:
    case at::kChar:
    case at::kByte:
      return tensor;
    default:
      break;
  }
  // Same element size, a type Gloo moves; values are copied bit for bit.
  switch (tensor.element_size()) {
    case 1:
      return tensor.view(at::kByte);
    case 2:
      return tensor.view(at::kHalf);
    case 4:
      return tensor.view(at::kInt);
    case 8:
      return tensor.view(at::kLong);
    default:
      MMSP_FAIL("dtype ", tensor.scalar_type(), " (", tensor.element_size(), " bytes) cannot be sent over Gloo");
  }
  return tensor;
}

}  // namespace mmsp::dist
