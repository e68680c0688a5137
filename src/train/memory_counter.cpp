// Counting CPU allocator; see memory_counter.h. The byte count sits in a 64-byte
// header before the data, so the data pointer is also the deleter's context.
#include "mmsp/train/memory_counter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <atomic>

namespace mmsp::train {
namespace {

constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned
std::atomic<int64_t> g_current{0}, g_peak{0};

void count(int64_t delta) {
  const int64_t now = g_current.fetch_add(delta) + delta;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

void release(void* data) {
  if (!data) return;
  char* raw = static_cast<char*>(data) - kHeader;
  count(-static_cast<int64_t>(*reinterpret_cast<size_t*>(raw)));
  c10::free_cpu(raw);
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) const override {
    char* raw = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    *reinterpret_cast<size_t*>(raw) = n;
    count(static_cast<int64_t>(n));
    void* data = raw + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
};

CountingAllocator g_allocator;

}  // namespace

void MemoryCounter::install() {
  static bool installed = [] {
    c10::SetCPUAllocator(&g_allocator, /*priority=*/1);
    return true;
  }();
  (void)installed;
}

// CPU tensors only. For CUDA tensors, read c10::cuda::CUDACachingAllocator's
// getDeviceStats(device): allocated_bytes[StatType::AGGREGATE].current / .peak
// (and resetPeakStats(device) for reset_peak) where LibTorch has CUDA.
int64_t MemoryCounter::current_bytes() { return g_current.load(); }
int64_t MemoryCounter::peak_bytes() { return g_peak.load(); }
void MemoryCounter::reset_peak() { g_peak.store(g_current.load()); }

}  // namespace mmsp::train
