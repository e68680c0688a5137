// reduce_scatter and all_gather_into; see shard_collectives.h.
#include "mmsp/dist/shard_collectives.h"

#include <ATen/ATen.h>

#include <vector>

#include "mmsp/core/check.h"

namespace mmsp::dist {
namespace {

int64_t shard_numel(const at::Tensor& flat, const Group& group, const char* what) {
  MMSP_CHECK(flat.dim() == 1 && flat.is_contiguous(), what, " on group ", group.name(),
             ": needs a contiguous 1-D buffer, got shape ", flat.sizes());
  MMSP_CHECK(flat.numel() % group.size() == 0, what, " on group ", group.name(), ": ", flat.numel(),
             " elements do not cut into ", group.size(), " equal shards (pad the buffer)");
  return flat.numel() / group.size();
}

}  // namespace

int64_t shard_collective_bytes(int64_t bytes, int group_size) { return (group_size - 1) * bytes / group_size; }

at::Tensor reduce_scatter(const at::Tensor& flat, Group& group) {
  const int64_t shard = shard_numel(flat, group, "reduce_scatter");
  const int64_t P = group.size();
  if (P == 1) return flat.clone();
  if (group.stages(flat)) return reduce_scatter(flat.cpu(), group).to(flat.device());
  at::Tensor recv = at::empty_like(flat);
  const bool gloo = group.uses_gloo(flat);
  at::Tensor send_wire = wire_view(flat, gloo), recv_wire = wire_view(recv, gloo);
  std::vector<int64_t> equal_splits;  // empty = equal pieces
  group.stats().add(
      CommKind::reduce_scatter, Pass::forward,
      shard_collective_bytes(flat.numel() * static_cast<int64_t>(flat.element_size()), static_cast<int>(P)));
  group.wait(group.backend_for(flat).alltoall_base(recv_wire, send_wire, equal_splits, equal_splits), "reduce_scatter");
  // recv [P, S]: row p is member p's copy of my shard. Sum in member order.
  const bool widen = flat.scalar_type() == at::kBFloat16 || flat.scalar_type() == at::kHalf;
  at::Tensor pieces = recv.view({P, shard});
  at::Tensor sum = pieces[0].to(widen ? at::kFloat : flat.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  for (int64_t p = 1; p < P; ++p) sum.add_(pieces[p]);
  return widen ? sum.to(flat.scalar_type()) : sum;
}

namespace {

// Checks the shapes, counts the bytes and issues the all-gather; null work when the
// group has one member (then `flat` is already written).
c10::intrusive_ptr<c10d::Work> issue_all_gather(const at::Tensor& shard, at::Tensor& flat, Group& group,
                                                std::vector<at::Tensor>& keep) {
  const int64_t S = shard_numel(flat, group, "all_gather_into");
  MMSP_CHECK(shard.dim() == 1 && shard.numel() == S && shard.scalar_type() == flat.scalar_type(),
             "all_gather_into on group ", group.name(), ": the shard ", shard.sizes(), " ", shard.scalar_type(),
             " must be [", S, "] of ", flat.scalar_type());
  const int64_t P = group.size();
  if (P == 1) {
    flat.copy_(shard);
    return {};
  }
  if (group.stages(flat)) {  // shared-GPU test mode: synchronous through host memory
    at::Tensor host = flat.cpu();
    all_gather_into(shard.cpu(), host, group);
    flat.copy_(host);
    return {};
  }
  const bool gloo = group.uses_gloo(flat);
  std::vector<at::Tensor> pieces;
  for (int64_t p = 0; p < P; ++p) pieces.push_back(wire_view(flat.narrow(0, p * S, S), gloo));
  std::vector<std::vector<at::Tensor>> outputs{pieces};
  std::vector<at::Tensor> inputs{wire_view(shard.contiguous(), gloo)};
  keep = pieces;
  keep.push_back(inputs[0]);
  group.stats().add(
      CommKind::all_gather, Pass::forward,
      shard_collective_bytes(flat.numel() * static_cast<int64_t>(flat.element_size()), static_cast<int>(P)));
  return group.backend_for(flat).allgather(outputs, inputs);
}

}  // namespace

void all_gather_into(const at::Tensor& shard, at::Tensor& flat, Group& group) {
  std::vector<at::Tensor> keep;
  const c10::intrusive_ptr<c10d::Work> work = issue_all_gather(shard, flat, group, keep);
  if (work) group.wait(work, "all_gather");
}

PendingGather all_gather_into_async(const at::Tensor& shard, at::Tensor& flat, const GroupPtr& group) {
  MMSP_CHECK(group, "all_gather_into_async: the group is null");
  std::vector<at::Tensor> keep;
  c10::intrusive_ptr<c10d::Work> work = issue_all_gather(shard, flat, *group, keep);
  if (!work) return {};
  return PendingGather(std::move(work), group, std::move(keep));
}

void PendingGather::wait() {
  if (!work_) return;
  const c10::intrusive_ptr<c10d::Work> work = std::move(work_);
  work_.reset();
  group_->wait(work, "all_gather (prefetched)");
  keep_.clear();
}

PendingGather& PendingGather::operator=(PendingGather&& other) {
  if (this != &other) {
    try {
      wait();
    } catch (const std::exception&) {
      // the transfer is over either way; its error was or will be seen by the collective after it
    }
    work_ = std::move(other.work_);
    group_ = std::move(other.group_);
    keep_ = std::move(other.keep_);
  }
  return *this;
}

PendingGather::~PendingGather() {
  try {
    wait();
  } catch (const std::exception&) {
    // a destructor cannot report; the next collective on the group fails with the reason
  }
}

}  // namespace mmsp::dist
