// Peak tensor memory of this process: a c10 CPU allocator that counts what it hands
// out (delegating to c10's own), installed for the whole process. It sees every CPU
// tensor, Gloo's threads included, but not oneDNN's scratch or from_blob memory.
#pragma once

#include <cstdint>

namespace mmsp::bench {

struct MemoryCounter {
  // Installs the counting allocator (idempotent). Call before the tensors to count.
  static void install();
  static int64_t current_bytes();
  static int64_t peak_bytes();
  // Starts a new peak from what is allocated now.
  static void reset_peak();
};

}  // namespace mmsp::bench
