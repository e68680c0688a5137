// Peak tensor memory of this process: a c10 CPU allocator that counts what it hands
// out (delegating to c10's own), installed for the whole process. It sees every CPU
// tensor, Gloo's threads included, but not oneDNN's scratch or from_blob memory.
// The trainer reports each rank's peak from it; the benchmarks use it too.
// CUDA tensors are not counted here: see the note in memory_counter.cpp.
#pragma once

#include <cstdint>

namespace mmsp::train {

struct MemoryCounter {
  // Installs the counting allocator (idempotent). Call before the tensors to count.
  static void install();
  static int64_t current_bytes();
  static int64_t peak_bytes();
  // Starts a new peak from what is allocated now.
  static void reset_peak();
};

}  // namespace mmsp::train
