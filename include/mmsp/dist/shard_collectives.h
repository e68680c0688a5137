// The two collectives of a sharded optimizer, on flat 1-D buffers cut into one equal
// shard per group member (member p owns elements [p·S, (p+1)·S)). Not differentiable:
// they move gradients and updated weights, outside autograd.
//
// Bytes this rank sends, for a buffer of n bytes over P members: (P−1)/P · n for each,
// as a ring would send; a reduce-scatter and an all-gather together move what one
// all-reduce moves (2 (P−1)/P · n).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "mmsp/dist/group.h"

namespace mmsp::dist {

// Returns this member's shard of the sum over the group: flat [P·S] -> [S]. Gloo in
// LibTorch 1.13 has no reduce_scatter, so the shards go out with one all-to-all and
// the P pieces received are summed here, in member order (the same order on every
// member, so every shard is summed alike). bf16 is sent as is and summed in fp32.
at::Tensor reduce_scatter(const at::Tensor& flat, Group& group);

// Every member's shard, in member order, into `flat` ([P·S], written in place).
void all_gather_into(const at::Tensor& shard, at::Tensor& flat, Group& group);

// An all-gather in flight: all_gather_into_async issues it and returns at once, so the
// caller computes while it moves (ZeRO-3's prefetch of the next layer); wait() finishes
// it, and `flat` holds the result from then on. It keeps its tensors and group alive
// until then; one dropped unfinished is waited for (errors then ignored), so no
// transfer is ever left writing into freed memory. Every member must issue its
// collectives on the group in the same order, as for the blocking ones.
class PendingGather {
 public:
  PendingGather() = default;
  PendingGather(c10::intrusive_ptr<c10d::Work> work, GroupPtr group, std::vector<at::Tensor> keep)
      : work_(std::move(work)), group_(std::move(group)), keep_(std::move(keep)) {}
  PendingGather(PendingGather&&) = default;
  PendingGather& operator=(PendingGather&& other);
  PendingGather(const PendingGather&) = delete;
  PendingGather& operator=(const PendingGather&) = delete;
  ~PendingGather();

  bool in_flight() const { return static_cast<bool>(work_); }
  // Blocks until the gather is done (an mmsp::Error naming the group if it failed).
  void wait();

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  GroupPtr group_;
  std::vector<at::Tensor> keep_;  // the wire views the backend reads and writes
};

PendingGather all_gather_into_async(const at::Tensor& shard, at::Tensor& flat, const GroupPtr& group);

// Bytes this member sends in either collective over a buffer of `bytes` bytes.
int64_t shard_collective_bytes(int64_t bytes, int group_size);

}  // namespace mmsp::dist
