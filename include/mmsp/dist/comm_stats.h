// Byte accounting: every collective adds the bytes this rank sends to other ranks,
// per kind and per pass (forward / backward), so benchmarks and training metrics
// can compare measured traffic with the formulas in docs/runtime.md#communication-volumes.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace mmsp::dist {

enum class CommKind : int {
  all_to_all = 0,
  all_to_all_v,
  all_gather_v,
  all_reduce,
  ring_exchange,
  reduce_scatter,  // sharded optimizer: gradients
  all_gather,      // sharded optimizer: updated weights
};
constexpr int kNumCommKinds = 7;
const char* comm_kind_name(CommKind kind);

enum class Pass : int { forward = 0, backward = 1 };

struct CommCount {
  int64_t calls = 0;
  int64_t bytes = 0;  // payload this rank sent to other ranks (nothing for its own share)
};

// Plain copy of the counters at one moment.
struct CommSnapshot {
  std::array<std::array<CommCount, 2>, kNumCommKinds> counts{};
  const CommCount& at(CommKind kind, Pass pass) const { return counts[static_cast<int>(kind)][static_cast<int>(pass)]; }
  int64_t total_bytes() const;
  CommSnapshot operator-(const CommSnapshot& earlier) const;
};

// Thread-safe counters shared by the groups of one mesh.
class CommStats {
 public:
  void add(CommKind kind, Pass pass, int64_t bytes);
  CommSnapshot snapshot() const;
  void reset();

 private:
  struct Cell {
    std::atomic<int64_t> calls{0};
    std::atomic<int64_t> bytes{0};
  };
  std::array<std::array<Cell, 2>, kNumCommKinds> cells_;
};

}  // namespace mmsp::dist
