// GPU memory as the CUDA caching allocator sees it: the bytes its tensors hold now and at
// their peak (allocated, not reserved: the cache's spare blocks are not the step's), and
// what the device has free. Compiled to clear errors where LibTorch has no CUDA.
#pragma once

#include <cstdint>

namespace mmsp::train {

struct CudaMemory {
  int64_t allocated = 0;  // bytes of live tensors on the device
  int64_t peak = 0;       // the most since the last reset_cuda_peak
  int64_t reserved = 0;   // held by the caching allocator (allocated + cached)
};

CudaMemory cuda_memory(int device);
void reset_cuda_peak(int device);     // the peak restarts from what is allocated now
int64_t cuda_free_bytes(int device);  // free on the device (cudaMemGetInfo) + the cache's spare

}  // namespace mmsp::train
