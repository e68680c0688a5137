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
// CUDA tensors are not counted here: see the note in memory_counter.cpp.
#pragma once

#include <atomic>
#include <cstdint>

namespace mmsp::train {

class MemoryCounter {
 public:
  // Starts counting (installing the counting allocator on first use).
  MemoryCounter();
  ~MemoryCounter();
  MemoryCounter(const MemoryCounter&) = delete;
  MemoryCounter& operator=(const MemoryCounter&) = delete;

  // Bytes of the tensors allocated since this counter began and not yet freed.
  int64_t current_bytes() const { return current_.load(); }
  // The highest current_bytes() since this counter began or the last reset_peak().
  int64_t peak_bytes() const { return peak_.load(); }
  // Starts a new peak from what is held now.
  void reset_peak() { peak_.store(current_.load()); }

  // Called by the counting allocator for an allocation (positive) or a free (negative).
  void count(int64_t delta);
  // The first allocation this counter counts (earlier ones' frees are not its business).
  uint64_t first_allocation() const { return first_allocation_; }

 private:
  std::atomic<int64_t> current_{0}, peak_{0};
  uint64_t first_allocation_ = 0;
};

}  // namespace mmsp::train
