// A process group of the mesh: its members, the c10d backend that moves tensors
// (Gloo for CPU tensors, NCCL for CUDA tensors where LibTorch has it), its timeout,
// and the byte counters it reports to. Collectives take a Group; nothing is global.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "mmsp/dist/comm_stats.h"

namespace mmsp::dist {

using Backend = c10d::Backend;  // ProcessGroupGloo and ProcessGroupNCCL are c10d Backends

class Group : public torch::CustomClassHolder {
 public:
  // cpu: Gloo backend (null for a one-member group); gpu: NCCL backend or null.
  Group(std::string name, std::vector<int> members, int rank, c10::intrusive_ptr<Backend> cpu,
        c10::intrusive_ptr<Backend> gpu, std::shared_ptr<CommStats> stats, std::chrono::milliseconds timeout,
        bool stage_cuda_through_host = false);

  const std::string& name() const { return name_; }  // e.g. "ring[dp=0,u=1]"
  int rank() const { return rank_; }                 // this process's rank in the group
  int size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const { return members_; }  // global ranks, by group rank
  std::chrono::milliseconds timeout() const { return timeout_; }
  CommStats& stats() const { return *stats_; }

  // The backend that moves `tensor` (by its device). Throws if none can.
  Backend& backend_for(const at::Tensor& tensor) const;
  // True when `tensor` goes through Gloo, which lacks bf16 and some integer types.
  bool uses_gloo(const at::Tensor& tensor) const;
  // True when `tensor` is on a GPU this group moves through host memory (the test-only
  // shared-GPU mode, rank_device.h): the collective copies it to the CPU, runs on Gloo and
  // copies the result back. The bytes counted are the same.
  bool stages(const at::Tensor& tensor) const { return stage_ && tensor.is_cuda(); }

  // Waits for `work`; a failure (dead peer, timeout) becomes an mmsp::Error that
  // names the collective, this group and its timeout.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* collective) const;

  // Tag for point-to-point messages; every member calls in the same order.
  int next_tag() { return tag_++; }

 private:
  std::string name_;
  std::vector<int> members_;
  int rank_;
  c10::intrusive_ptr<Backend> cpu_;
  c10::intrusive_ptr<Backend> gpu_;
  std::shared_ptr<CommStats> stats_;
  std::chrono::milliseconds timeout_;
  bool stage_ = false;
  int tag_ = 0;
};

using GroupPtr = c10::intrusive_ptr<Group>;

// A one-member group (no communication): collectives on it are identities.
GroupPtr make_solo_group(const std::string& name, int global_rank,
                         std::shared_ptr<CommStats> stats = std::make_shared<CommStats>());

// Autograd contexts keep their group as an IValue capsule.
inline at::IValue group_to_ivalue(const GroupPtr& group) { return at::IValue::make_capsule(group); }
GroupPtr group_from_ivalue(const at::IValue& value);

// Gloo moves bytes: present a tensor of a type it lacks (bf16, bool, int16, ...)
// as a same-size type it has. The result shares storage with `tensor`.
at::Tensor wire_view(const at::Tensor& tensor, bool gloo);

}  // namespace mmsp::dist
