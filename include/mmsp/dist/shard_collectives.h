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

#include "mmsp/dist/group.h"

namespace mmsp::dist {

// Returns this member's shard of the sum over the group: flat [P·S] -> [S]. Gloo in
// LibTorch 1.13 has no reduce_scatter, so the shards go out with one all-to-all and
// the P pieces received are summed here, in member order (the same order on every
// member, so every shard is summed alike). bf16 is sent as is and summed in fp32.
at::Tensor reduce_scatter(const at::Tensor& flat, Group& group);

// Every member's shard, in member order, into `flat` ([P·S], written in place).
void all_gather_into(const at::Tensor& shard, at::Tensor& flat, Group& group);

// Bytes this member sends in either collective over a buffer of `bytes` bytes.
int64_t shard_collective_bytes(int64_t bytes, int group_size);

}  // namespace mmsp::dist
