// glibc's mmap threshold for the mmsp tool; see heap_policy.h.
#include "heap_policy.h"

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace mmsp::cli {

bool map_large_blocks_separately() {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) return false;
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
#else
  return false;
#endif
}

}  // namespace mmsp::cli
