// Layer inputs kept in host memory; see activation_offload.h.
#include "mmsp/model/hooks/activation_offload.h"

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <utility>

#include "mmsp/core/check.h"

#ifdef MMSP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace mmsp::model {

struct ActivationOffload::Streams {
#ifdef MMSP_WITH_CUDA
  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> side;
  c10::cuda::CUDAStream for_device(c10::DeviceIndex index) {
    auto found = side.find(index);
    if (found == side.end()) found = side.emplace(index, c10::cuda::getStreamFromPool(false, index)).first;
    return found->second;
  }
#endif
};

struct ActivationOffload::Entry {
  at::Tensor host;  // the stashed copy
  c10::Device device{c10::kCPU};
  at::Tensor back;                // the copy on its way back (or back), once started
  std::weak_ptr<Entry> previous;  // stashed just before: the backward's next recompute
  std::shared_ptr<int64_t> host_bytes;
#ifdef MMSP_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> side;
  at::cuda::CUDAEvent stashed, returned;  // the copy to host, and back, have landed
#endif
  ~Entry() {
    if (host_bytes && host.defined()) *host_bytes -= static_cast<int64_t>(host.nbytes());
  }
};

ActivationOffload::ActivationOffload()
    : streams_(std::make_unique<Streams>()), host_bytes_(std::make_shared<int64_t>(0)) {}
ActivationOffload::~ActivationOffload() = default;

int64_t ActivationOffload::host_bytes() const { return *host_bytes_; }

std::shared_ptr<ActivationOffload::Entry> ActivationOffload::stash(const at::Tensor& x) {
  auto e = std::make_shared<Entry>();
  e->device = x.device();
  e->previous = last_;
  e->host_bytes = host_bytes_;
  const at::Tensor source = x.detach();
  if (x.is_cuda()) {
#ifdef MMSP_WITH_CUDA
    const c10::cuda::CUDAStream side = streams_->for_device(x.device().index());
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(x.device().index());
    at::cuda::CUDAEvent written;  // x is complete once the current stream's work so far is done
    written.record(current);
    written.block(side);
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      e->host = at::empty(source.sizes(), source.options().device(c10::kCPU).pinned_memory(true));
      e->host.copy_(source, /*non_blocking=*/true);
      e->stashed.record(side);
    }
    // x's memory may go back to the allocator now, but not be reused before the copy.
    c10::cuda::CUDACachingAllocator::recordStream(source.storage().data_ptr(), side);
    e->side = side;
#else
    MMSP_FAIL("--offload-activations on ", x.device(), ": this mmsp was built without CUDA");
#endif
  } else {
    MMSP_CHECK(x.device().is_cpu(), "--offload-activations serves CUDA and CPU tensors, not ", x.device());
    e->host = source.clone(at::MemoryFormat::Contiguous);  // the host is the device: a copy
  }
  *host_bytes_ += static_cast<int64_t>(e->host.nbytes());
  last_ = e;
  return e;
}

#ifdef MMSP_WITH_CUDA
namespace {
// Brings an entry back on its side stream (after its copy to host, which that stream
// ordered first); `returned` marks when it lands.
void start_return(ActivationOffload::Entry& e) {
  if (e.back.defined()) return;
  c10::cuda::CUDAStreamGuard on_side(*e.side);
  e.back = e.host.to(e.device, /*non_blocking=*/true);  // after the copy to host, on the same stream
  e.returned.record(*e.side);
}
}  // namespace
#endif

at::Tensor ActivationOffload::restore(Entry& e) {
  at::Tensor x;
  if (e.device.is_cuda()) {
#ifdef MMSP_WITH_CUDA
    start_return(e);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(e.device.index());
    e.returned.block(current);
    // Made on the side stream, read on the current one: not reused before that is done.
    c10::cuda::CUDACachingAllocator::recordStream(e.back.storage().data_ptr(), current);
    x = e.back;
    if (auto previous = e.previous.lock(); previous && previous->device == e.device) start_return(*previous);
#endif
  } else {
    x = e.host;
  }
  e.back = at::Tensor();
  return x;
}

}  // namespace mmsp::model
