// --offload-activations: what a recomputed layer keeps from its forward to its backward
// (its input, [tokens, hidden]: one per decoder layer and step, 28 × 32k × 3,584 × 2 bytes
// = 6.6 GB for Qwen2-VL-7B at 32k tokens a rank) waits in host memory instead of on the
// device. On CUDA each input goes to pinned host memory on a side stream as soon as its
// layer has read it (the device copy is freed once it lands), and comes back on that
// stream when a recompute starts, which also starts bringing back the input stashed
// before it (the backward's next layer): the copies overlap the layers' compute. On the
// CPU the same path runs as a copy (the host is the device: nothing is saved, but the
// code and its numerics are the ones CUDA runs). Copies do not change values: exact.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

namespace mmsp::model {

class ActivationOffload {
 public:
  ActivationOffload();
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // One stashed tensor, held by the autograd node that reads it back.
  struct Entry;
  // Starts x's copy to host memory; x itself may be dropped at once.
  std::shared_ptr<Entry> stash(const at::Tensor& x);
  // x again, on its device and in the current stream's order; then starts bringing back
  // the entry stashed just before this one, if it is still held.
  at::Tensor restore(Entry& entry);

  // The host bytes held by stashed entries now (what left the device).
  int64_t host_bytes() const;

 private:
  struct Streams;
  std::unique_ptr<Streams> streams_;  // CUDA: one side stream per device
  std::weak_ptr<Entry> last_;         // the entry stashed last (the next one links to it)
  std::shared_ptr<int64_t> host_bytes_;
};

}  // namespace mmsp::model
