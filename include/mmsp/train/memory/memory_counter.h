// Peak tensor memory of a run: a MemoryCounter, owned by its caller (a training run, a
// benchmark), counts the CPU tensor bytes allocated from its construction on and still
// held, and the highest that count reached.
//
// The counts come from one counting c10 CPU allocator (delegating to the one installed
// before it: c10's own, or the mmsp tool's block cache) that the first counter installs
// for the rest of the process: c10 has a single CPU allocator per process, so a counter
// sees every CPU tensor allocated while it lives, whoever allocates
// it (Gloo's threads included, not oneDNN's scratch or from_blob memory). Two counters
// keep separate counts from their own start, but two models running at the same time in
// one process see each other's tensors: run them one after the other to tell them apart.
// A counter made for a CUDA device reads the CUDA caching allocator's statistics instead
// (cuda_memory.h: bytes of live tensors on that device from the counter's start, and their
// peak); the CPU machinery above plays no part for CUDA tensors.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>

namespace mmsp::train {

class MemoryCounter {
 public:
  // Starts counting (installing the counting allocator on first use); on a CUDA device,
  // from what that device holds now, with its peak reset.
  explicit MemoryCounter(c10::Device device = c10::Device(c10::kCPU));
  ~MemoryCounter();
  MemoryCounter(const MemoryCounter&) = delete;
  MemoryCounter& operator=(const MemoryCounter&) = delete;

  // Bytes of the tensors allocated since this counter began and not yet freed.
  int64_t current_bytes() const;
  // The highest current_bytes() since this counter began or the last reset_peak().
  int64_t peak_bytes() const;
  // Starts a new peak from what is held now.
  void reset_peak();
  const c10::Device& device() const { return device_; }

  // Called by the counting allocator for an allocation (positive) or a free (negative).
  void count(int64_t delta);
  // The first allocation this counter counts (earlier ones' frees are not its business).
  uint64_t first_allocation() const { return first_allocation_; }

 private:
  std::atomic<int64_t> current_{0}, peak_{0};
  uint64_t first_allocation_ = 0;
  c10::Device device_;
  int cuda_index() const { return device_.has_index() ? device_.index() : 0; }
  int64_t cuda_baseline_ = 0;  // the device's allocated bytes when this counter began
};

}  // namespace mmsp::train
