// The mmsp tool's heap policy (src/cli/heap_policy.h): a block of 1 MiB or more is mapped
// on its own even after a larger block was freed, when glibc's own dynamic threshold would
// have served it from the heap arena. The premise is checked too, in a child process that
// keeps glibc's default.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "heap_policy.h"

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

// Frees an 8 MiB block, then says whether a 2 MiB block allocated after it is mapped.
// (volatile: the compiler may otherwise drop a malloc whose memory nobody reads.)
bool two_mib_mapped_after_freeing_eight() {
  void* volatile big = std::malloc(8 << 20);
  std::memset(big, 1, 8 << 20);
  std::free(big);
  const size_t before = mallinfo2().hblks;
  void* volatile block = std::malloc(2 << 20);
  const size_t during = mallinfo2().hblks;
  std::free(block);
  return during == before + 1;
}

}  // namespace

TEST(HeapPolicy, LargeBlocksStayMappedAfterALargerFree) {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) GTEST_SKIP() << "MALLOC_MMAP_THRESHOLD_ is set";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(two_mib_mapped_after_freeing_eight() ? 1 : 0);  // glibc's default
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "with glibc's default the 2 MiB block was mapped: the premise is gone";
  ASSERT_TRUE(mmsp::cli::map_large_blocks_separately());
  EXPECT_TRUE(two_mib_mapped_after_freeing_eight()) << "the 2 MiB block came from the heap arena";
}
#endif
