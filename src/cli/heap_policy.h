// Where a rank's freed tensor memory goes. glibc serves blocks below its mmap threshold
// from its heap arenas. Each time a mapped block larger than the threshold is freed, it
// raises the threshold (up to 32 MiB). After a few layers most of a step's tensors live
// in the arenas, which give memory back to the system only from their top. A rank's
// resident memory then stays GiBs above the tensors it holds.
//
// Fixing the threshold at 1 MiB maps each block of 1 MiB or more on its own and unmaps it
// when freed: resident memory follows the live tensors. Alone, it costs a page fault per
// fresh page at every such allocation (1.8× the step of a 4-layer Qwen3.5 at 1,024
// tokens a rank against a threshold fixed at 32 MiB); the block cache (block_cache.h)
// wins that back by keeping a bounded set of freed blocks resident for reuse.
#pragma once

#include <cstddef>

namespace mmsp::cli {

inline constexpr std::size_t kMmapThresholdBytes = std::size_t{1} << 20;

// Fixes glibc's mmap threshold at kMmapThresholdBytes, unless the user set
// MALLOC_MMAP_THRESHOLD_ (glibc then follows theirs). Returns whether it set it; does
// nothing outside glibc.
bool map_large_blocks_separately();

}  // namespace mmsp::cli
