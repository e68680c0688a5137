// Packing sequences into one row per dp rank, each split one padded to a multiple of 2 x ring.
#include "mmsp/plan/packing.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "mmsp/core/check.h"

namespace mmsp::plan {

PackedRow pack_row(const std::vector<int64_t>& sequences, const std::vector<int64_t>& lengths, int ring,
                   const std::vector<int>& home) {
  MMSP_ASSERT(sequences.size() == lengths.size());
  MMSP_ASSERT(home.empty() || home.size() == lengths.size(), home.size(), " homes for ", lengths.size(), " sequences");
  MMSP_CHECK(ring >= 1, "ring must be >= 1, got ", ring);
  const int64_t multiple = 2 * int64_t{ring};
  PackedRow row;
  row.segments.reserve(sequences.size());
  row.cu_seqlens.reserve(sequences.size() + 1);
  row.cu_seqlens.push_back(0);
  for (size_t i = 0; i < sequences.size(); ++i) {
    MMSP_CHECK(lengths[i] >= 1, "sequence ", sequences[i], ": length must be >= 1, got ", lengths[i]);
    Segment s;
    s.sequence = sequences[i];
    s.start = row.length;
    s.length = lengths[i];
    s.home = home.empty() ? -1 : home[i];
    // A whole segment's tokens all sit on one rank: nothing to cut into equal chunks.
    s.padded_length = s.home >= 0 ? s.length : (lengths[i] + multiple - 1) / multiple * multiple;
    row.length += s.padded_length;
    row.real_tokens += s.length;
    MMSP_CHECK(row.length <= std::numeric_limits<int32_t>::max(), "packed row holds ", row.length,
               " tokens after sequence ", s.sequence, " (each split one padded to a multiple of 2 x ring = ", multiple,
               "); cu_seqlens are int32 for the attention kernel, so a row holds at most ",
               std::numeric_limits<int32_t>::max(), " tokens: use more dp ranks or shorter sequences");
    row.segments.push_back(s);
    row.cu_seqlens.push_back(row.length);
  }
  return row;
}

std::vector<std::vector<int64_t>> assign_sequences_to_dp(const std::vector<int64_t>& lengths, int dp) {
  MMSP_CHECK(!lengths.empty(), "batch is empty: it needs at least one sequence");
  MMSP_CHECK(dp >= 1, "dp must be >= 1, got ", dp);
  MMSP_CHECK(static_cast<int64_t>(lengths.size()) >= dp, "batch has ", lengths.size(), " sequences but dp is ", dp,
             ": every dp rank needs at least one sequence");
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<int64_t> load(dp, 0);
  std::vector<std::vector<int64_t>> out(dp);
  for (int64_t s : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += lengths[s];
    out[r].push_back(s);
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

}  // namespace mmsp::plan
