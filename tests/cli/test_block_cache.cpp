// The cache of freed large blocks (src/cli/block_cache.h): a freed block of at least the
// minimum size comes back for the next request of about its size, already written to;
// small blocks are not kept; what is kept stays within the capacity, the oldest going
// first; concurrent use from several threads keeps the books straight.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "block_cache.h"

using mmsp::cli::BlockCache;

namespace {
constexpr size_t MiB = size_t{1} << 20;
}

TEST(BlockCache, AFreedLargeBlockServesTheNextRequestOfAboutItsSize) {
  BlockCache cache(MiB, 64 * MiB);
  void* first = nullptr;
  {
    c10::DataPtr block = cache.allocate(8 * MiB);
    std::memset(block.get(), 7, 8 * MiB);
    first = block.get();
  }
  EXPECT_EQ(cache.kept_bytes(), 8 * MiB);
  {
    c10::DataPtr smaller = cache.allocate(4 * MiB);  // more than 1/8 smaller: a new block
    EXPECT_NE(smaller.get(), first);
    EXPECT_EQ(cache.hits(), 0u);
  }
  c10::DataPtr again = cache.allocate(8 * MiB - 4096);  // within 1/8: the kept block
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(static_cast<unsigned char*>(again.get())[8 * MiB - 4097], 7) << "its pages were kept";
  EXPECT_EQ(cache.kept_bytes(), 4 * MiB) << "the 4 MiB block is kept; the 8 MiB one is in use";
  again.clear();
  // The reused block keeps its full size: it is kept as 8 MiB again.
  EXPECT_EQ(cache.kept_bytes(), 12 * MiB);
}

TEST(BlockCache, SmallBlocksAreNotKept) {
  BlockCache cache(MiB, 64 * MiB);
  { c10::DataPtr small = cache.allocate(MiB - 1); }
  { c10::DataPtr zero = cache.allocate(0); }
  EXPECT_EQ(cache.kept_bytes(), 0u);
}

TEST(BlockCache, KeepsAtMostItsCapacityTheOldestGoingFirst) {
  BlockCache cache(MiB, 3 * MiB);
  std::vector<c10::DataPtr> blocks;
  for (size_t mib : {1, 1, 1, 2}) blocks.push_back(cache.allocate(mib * MiB));
  for (auto& b : blocks) b.clear();  // 1, 1, 1 kept; then 2 pushes the two oldest out
  EXPECT_EQ(cache.kept_bytes(), 3 * MiB);
  c10::DataPtr two = cache.allocate(2 * MiB);
  EXPECT_EQ(cache.hits(), 1u) << "the newest (2 MiB) block was kept";
  EXPECT_EQ(cache.kept_bytes(), MiB);
  { c10::DataPtr too_big = cache.allocate(4 * MiB); }  // larger than the capacity: not kept
  EXPECT_EQ(cache.kept_bytes(), MiB);
}

TEST(BlockCache, ThreadsShareItSafely) {
  BlockCache cache(MiB, 16 * MiB);
  auto work = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<c10::DataPtr> held;
    for (int i = 0; i < 400; ++i) {
      const size_t bytes = std::uniform_int_distribution<size_t>(MiB / 2, 3 * MiB)(rng);
      held.push_back(cache.allocate(bytes));
      static_cast<char*>(held.back().get())[bytes - 1] = 1;
      if (held.size() > 3) held.erase(held.begin() + std::uniform_int_distribution<size_t>(0, 3)(rng));
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) threads.emplace_back(work, t);
  for (auto& t : threads) t.join();
  EXPECT_LE(cache.kept_bytes(), 16 * MiB);
  EXPECT_GT(cache.hits(), 0u);
}

// MMSP_BLOCK_CACHE_BYTES: a number of bytes, 0 keeping nothing (nothing installed); any
// other text is refused, naming the variable and the value.
TEST(BlockCache, TheCapacityVariableIsABytesCountOrRefused) {
  for (const char* bad : {"12x", "", "-5", "lots"}) {
    setenv("MMSP_BLOCK_CACHE_BYTES", bad, 1);
    try {
      mmsp::cli::install_block_cache();
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("MMSP_BLOCK_CACHE_BYTES=\"") + bad + "\""), std::string::npos)
          << e.what();
    }
  }
  setenv("MMSP_BLOCK_CACHE_BYTES", "0", 1);
  EXPECT_EQ(mmsp::cli::install_block_cache(), 0u);
  unsetenv("MMSP_BLOCK_CACHE_BYTES");
}
