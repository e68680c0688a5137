// Counting CPU allocator and the counters it feeds; see memory_counter.h. Each
// allocation carries a 64-byte header before the data with its size, its number in
// allocation order and how to free it, so the data pointer is also the deleter's
// context and a free is charged only to the counters that counted the allocation (those
// begun before it). It takes its memory from the CPU allocator installed before it
// (c10's own, or the mmsp tool's cache of large blocks).
#include "mmsp/train/memory/memory_counter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "mmsp/compat/cpu_allocator.h"
#include "mmsp/train/memory/cuda_memory.h"

namespace mmsp::train {
namespace {

constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned
struct Header {
  size_t bytes;
  uint64_t number;            // in allocation order, across the process
  c10::DeleterFnPtr deleter;  // the inner allocator's, with its context
  void* context;
};
static_assert(sizeof(Header) <= kHeader);

// The live counters. Allocations read the list under a shared lock, so a counter that
// ends never receives a count afterwards; numbering inside that lock makes "begun
// before the allocation" and "was in the list when it was counted" the same thing.
struct Counters {
  std::shared_mutex mutex;
  std::vector<MemoryCounter*> live;
  std::atomic<uint64_t> next_number{0};
};

Counters& counters() {
  static Counters* c = new Counters;  // never destroyed: frees may come after exit begins
  return *c;
}

void release(void* data) {
  if (!data) return;
  char* raw = static_cast<char*>(data) - kHeader;
  const Header h = *reinterpret_cast<const Header*>(raw);
  {
    Counters& c = counters();
    std::shared_lock lock(c.mutex);
    for (MemoryCounter* counter : c.live)
      if (h.number >= counter->first_allocation()) counter->count(-static_cast<int64_t>(h.bytes));
  }
  h.deleter(h.context);
}

struct CountingAllocator final : compat::CpuAllocator {
  explicit CountingAllocator(c10::Allocator* inner) : inner(inner) {}
  c10::Allocator* inner;
  c10::DataPtr allocate_block(size_t n) const override {
    c10::DataPtr block = inner->allocate(n + kHeader);
    char* raw = static_cast<char*>(block.get());
    Header* h = reinterpret_cast<Header*>(raw);
    h->bytes = n;
    h->deleter = block.get_deleter();
    h->context = block.release_context();
    {
      Counters& c = counters();
      std::shared_lock lock(c.mutex);
      h->number = c.next_number.fetch_add(1, std::memory_order_relaxed);
      for (MemoryCounter* counter : c.live) counter->count(static_cast<int64_t>(n));
    }
    void* data = raw + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
};

void install_counting_allocator() {
  static bool installed = [] {
    static CountingAllocator allocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    return true;
  }();
  (void)installed;
}

}  // namespace

MemoryCounter::MemoryCounter(c10::Device device) : device_(device) {
  if (device_.is_cuda()) {
    reset_cuda_peak(cuda_index());
    cuda_baseline_ = cuda_memory(cuda_index()).allocated;
  }
  install_counting_allocator();
  Counters& c = counters();
  std::unique_lock lock(c.mutex);
  first_allocation_ = c.next_number.load();
  c.live.push_back(this);
}

MemoryCounter::~MemoryCounter() {
  Counters& c = counters();
  std::unique_lock lock(c.mutex);
  c.live.erase(std::remove(c.live.begin(), c.live.end(), this), c.live.end());
}

void MemoryCounter::count(int64_t delta) {
  const int64_t now = current_.fetch_add(delta) + delta;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {}
}

int64_t MemoryCounter::current_bytes() const {
  if (device_.is_cuda()) return cuda_memory(cuda_index()).allocated - cuda_baseline_;
  return current_.load();
}

int64_t MemoryCounter::peak_bytes() const {
  if (device_.is_cuda()) return cuda_memory(cuda_index()).peak - cuda_baseline_;
  return peak_.load();
}

void MemoryCounter::reset_peak() {
  if (device_.is_cuda()) return reset_cuda_peak(cuda_index());
  peak_.store(current_.load());
}

}  // namespace mmsp::train
