// A CPU allocator that keeps freed large blocks for the next request of about their size.
//
// The heap policy (heap_policy.h) maps every block of 1 MiB or more on its own so that
// resident memory follows the live tensors; each such allocation then page-faults its
// pages in afresh, which made a training step 1.8× slower (docs/bench/headline.md). A step asks
// for the same sizes over and over (each layer, each vocabulary block), so a block
// freed by one use is kept, already resident, for the next: LibTorch's CUDA caching
// allocator does the same on GPUs. What is kept is bounded by `capacity` bytes; beyond
// it the blocks kept longest are given back to the system.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <list>
#include <map>
#include <mutex>
#include <utility>

#include "mmsp/compat/cpu_allocator.h"

namespace mmsp::cli {

class BlockCache final : public compat::CpuAllocator {
 public:
  // Blocks of at least `min_block` bytes are kept after a free, at most `capacity`
  // bytes of them at a time; a request takes a kept block at most 1/8 larger.
  BlockCache(size_t min_block, size_t capacity);
  ~BlockCache() override;
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  c10::DeleterFnPtr raw_deleter() const override;

  size_t kept_bytes() const;  // freed and kept now
  size_t hits() const;        // requests served from kept blocks

 protected:
  c10::DataPtr allocate_block(size_t bytes) const override;

 private:
  struct Block {
    void* raw;
    size_t bytes;  // usable bytes after the header
  };
  static void release(void* data);
  void give_back(void* raw, size_t bytes) const;
  void* take(size_t bytes, size_t* got) const;

  size_t min_block_, capacity_;
  mutable std::mutex mutex_;
  mutable std::list<Block> kept_;                                      // oldest first
  mutable std::multimap<size_t, std::list<Block>::iterator> by_size_;  // bytes -> block
  mutable size_t kept_bytes_ = 0, hits_ = 0;
};

// Installs a process-wide BlockCache as c10's CPU allocator (blocks ≥ 1 MiB, capacity
// from MMSP_BLOCK_CACHE_BYTES, default 512 MiB; 0 installs nothing). Returns the
// capacity installed.
size_t install_block_cache();

}  // namespace mmsp::cli
