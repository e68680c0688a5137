// The CUDA caching allocator's statistics; see cuda_memory.h.
#include "mmsp/train/memory/cuda_memory.h"

#include "mmsp/core/check.h"

#ifdef MMSP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace mmsp::train {

#ifdef MMSP_WITH_CUDA

namespace {
constexpr size_t kAll = 0;  // StatType::AGGREGATE: both pools (its namespace moved between releases)
}  // namespace

CudaMemory cuda_memory(int device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return {stats.allocated_bytes[kAll].current, stats.allocated_bytes[kAll].peak, stats.reserved_bytes[kAll].current};
}

void reset_cuda_peak(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

int64_t cuda_free_bytes(int device) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  size_t free = 0, total = 0;
  const cudaError_t err = cudaMemGetInfo(&free, &total);
  MMSP_CHECK(err == cudaSuccess, "cudaMemGetInfo on cuda:", device, " failed: ", cudaGetErrorString(err));
  const CudaMemory m = cuda_memory(device);
  return static_cast<int64_t>(free) + (m.reserved - m.allocated);
}

#else

namespace {
[[noreturn]] void no_cuda() {
  throw Error("GPU memory statistics: this mmsp was built against a LibTorch without CUDA");
}
}  // namespace

CudaMemory cuda_memory(int) { no_cuda(); }
void reset_cuda_peak(int) { no_cuda(); }
int64_t cuda_free_bytes(int) { no_cuda(); }

#endif

}  // namespace mmsp::train
