// The compat seam for c10::Allocator (docs/building.md#libtorch-versions).
//
// mmsp installs its own CPU allocators (the tool's block cache, the memory counter).
// LibTorch has changed this interface across releases: allocate() lost its `const`
// and copy_data() became pure virtual (both in 2.x, present in 2.11 and 2.15). An mmsp
// allocator derives from CpuAllocator and writes only allocate_block() and
// raw_deleter(); this class is what meets the current signature.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>

namespace mmsp::compat {

class CpuAllocator : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) final { return allocate_block(bytes); }
  // Blocks hold plain host bytes: a memcpy copies them.
  void copy_data(void* dest, const void* src, std::size_t count) const final { default_copy_data(dest, src, count); }

 protected:
  // Thread-safe: c10 calls it from any thread (Gloo's included).
  virtual c10::DataPtr allocate_block(std::size_t bytes) const = 0;
};

}  // namespace mmsp::compat
