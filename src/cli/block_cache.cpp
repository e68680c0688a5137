// The cache of freed large blocks; see block_cache.h. Each block carries a 64-byte
// header before its data (the cache and the usable size), so the deleter needs only
// the data pointer.
#include "block_cache.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "mmsp/core/check.h"

namespace mmsp::cli {
namespace {

constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned
struct Header {
  const BlockCache* owner;
  size_t bytes;
};
static_assert(sizeof(Header) <= kHeader);

}  // namespace

BlockCache::BlockCache(size_t min_block, size_t capacity) : min_block_(min_block), capacity_(capacity) {}

BlockCache::~BlockCache() {
  for (const Block& b : kept_) c10::free_cpu(b.raw);
}

void* BlockCache::take(size_t bytes, size_t* got) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_size_.lower_bound(bytes);
  if (it == by_size_.end() || it->first > bytes + bytes / 8) return nullptr;
  const Block block = *it->second;
  kept_.erase(it->second);
  by_size_.erase(it);
  kept_bytes_ -= block.bytes;
  ++hits_;
  *got = block.bytes;
  return block.raw;
}

c10::DataPtr BlockCache::allocate_block(size_t bytes) const {
  size_t usable = bytes;
  void* raw = bytes >= min_block_ ? take(bytes, &usable) : nullptr;
  if (!raw) raw = c10::alloc_cpu(bytes + kHeader);
  auto* header = static_cast<Header*>(raw);
  header->owner = this;
  header->bytes = usable;
  void* data = static_cast<char*>(raw) + kHeader;
  return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr BlockCache::raw_deleter() const { return &release; }

void BlockCache::release(void* data) {
  if (!data) return;
  void* raw = static_cast<char*>(data) - kHeader;
  const Header header = *static_cast<const Header*>(raw);
  header.owner->give_back(raw, header.bytes);
}

void BlockCache::give_back(void* raw, size_t bytes) const {
  if (bytes < min_block_ || bytes > capacity_) {
    c10::free_cpu(raw);
    return;
  }
  std::list<Block> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.push_back(Block{raw, bytes});
    by_size_.emplace(bytes, std::prev(kept_.end()));
    kept_bytes_ += bytes;
    while (kept_bytes_ > capacity_) {  // the oldest go back to the system
      const Block& oldest = kept_.front();
      auto range = by_size_.equal_range(oldest.bytes);
      for (auto it = range.first; it != range.second; ++it)
        if (it->second == kept_.begin()) {
          by_size_.erase(it);
          break;
        }
      kept_bytes_ -= oldest.bytes;
      evicted.splice(evicted.end(), kept_, kept_.begin());
    }
  }
  for (const Block& b : evicted) c10::free_cpu(b.raw);  // outside the lock: munmap is slow
}

size_t BlockCache::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_bytes_;
}

size_t BlockCache::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

size_t install_block_cache() {
  size_t capacity = size_t{512} << 20;
  if (const char* env = std::getenv("MMSP_BLOCK_CACHE_BYTES")) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(env, &end, 10);
    MMSP_CHECK(end != env && *end == '\0' && env[0] != '-', "MMSP_BLOCK_CACHE_BYTES=\"", env,
               "\" must be a number of bytes (0: keep no freed blocks)");
    capacity = static_cast<size_t>(value);
  }
  if (capacity == 0) return 0;
  static BlockCache* cache = new BlockCache(size_t{1} << 20, capacity);  // never destroyed: frees come late
  c10::SetCPUAllocator(cache, /*priority=*/1);
  return capacity;
}

}  // namespace mmsp::cli
