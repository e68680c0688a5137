// Ring exchange: every rank sends tensors to the rank `offset` places ahead in the
// group and receives the same shapes from the rank `offset` places behind, all
// tensors of one exchange posted together. RingExchange is the asynchronous
// protocol object (start, compute, wait) ring attention overlaps with; ring_exchange
// is the synchronous differentiable form, whose backward runs the ring backwards.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mmsp/dist/group.h"

namespace mmsp::dist {

class RingExchange {
 public:
  explicit RingExchange(GroupPtr group, int offset = 1, Pass pass = Pass::forward);
  RingExchange(const RingExchange&) = delete;
  RingExchange& operator=(const RingExchange&) = delete;
  ~RingExchange();  // waits for a started exchange, so no buffer is freed in flight

  // Posts the sends and receives. Every rank sends the same shapes. A second
  // start() on the same object is an error.
  void start(const std::vector<at::Tensor>& send);
  // Blocks until done and returns the received tensors. Before start(), or a
  // second time, is an error: the buffers are only readable after the wait.
  std::vector<at::Tensor> wait();

  int send_to() const { return to_; }      // group rank we send to
  int recv_from() const { return from_; }  // group rank we receive from

 private:
  GroupPtr group_;
  Pass pass_;
  int to_, from_;
  enum class State { idle, started, done } state_ = State::idle;
  std::vector<at::Tensor> sent_, received_;
  std::vector<c10::Device> devices_;  // of the tensors given (received ones return there)
  std::vector<c10::intrusive_ptr<c10d::Work>> work_;
};

// Differentiable, synchronous: returns what rank (r - offset) sent.
std::vector<at::Tensor> ring_exchange(const std::vector<at::Tensor>& send, const GroupPtr& group, int offset = 1);

}  // namespace mmsp::dist
