// Byte counters; see comm_stats.h.
#include "mmsp/dist/comm_stats.h"

namespace mmsp::dist {

const char* comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::all_to_all:
      return "all_to_all";
    case CommKind::all_to_all_v:
      return "all_to_all_v";
    case CommKind::all_gather_v:
      return "all_gather_v";
    case CommKind::all_reduce:
      return "all_reduce";
    case CommKind::ring_exchange:
      return "ring_exchange";
    case CommKind::reduce_scatter:
      return "reduce_scatter";
    case CommKind::all_gather:
      return "all_gather";
  }
  return "?";
}

int64_t CommSnapshot::total_bytes() const {
  int64_t total = 0;
  for (const auto& kind : counts)
    for (const auto& pass : kind) total += pass.bytes;
  return total;
}

CommSnapshot CommSnapshot::operator-(const CommSnapshot& earlier) const {
  CommSnapshot diff = *this;
  for (int k = 0; k < kNumCommKinds; ++k)
    for (int p = 0; p < 2; ++p) {
      diff.counts[k][p].calls -= earlier.counts[k][p].calls;
      diff.counts[k][p].bytes -= earlier.counts[k][p].bytes;
    }
  return diff;
}

void CommStats::add(CommKind kind, Pass pass, int64_t bytes) {
  auto& cell = cells_[static_cast<int>(kind)][static_cast<int>(pass)];
  cell.calls.fetch_add(1, std::memory_order_relaxed);
  cell.bytes.fetch_add(bytes, std::memory_order_relaxed);
}

CommSnapshot CommStats::snapshot() const {
  CommSnapshot snap;
  for (int k = 0; k < kNumCommKinds; ++k)
    for (int p = 0; p < 2; ++p) {
      snap.counts[k][p].calls = cells_[k][p].calls.load(std::memory_order_relaxed);
      snap.counts[k][p].bytes = cells_[k][p].bytes.load(std::memory_order_relaxed);
    }
  return snap;
}

void CommStats::reset() {
  for (auto& kind : cells_)
    for (auto& cell : kind) {
      cell.calls = 0;
      cell.bytes = 0;
    }
}

}  // namespace mmsp::dist
