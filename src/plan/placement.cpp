// Zigzag and adaptive placement of a row's segments; see placement.h.
#include "mmsp/plan/placement.h"

#include <algorithm>
#include <numeric>

#include "mmsp/core/check.h"

namespace mmsp::plan {

Placement parse_placement(const std::string& name) {
  if (name == "zigzag") return Placement::zigzag;
  if (name == "adaptive") return Placement::adaptive;
  MMSP_FAIL("placement \"", name, "\" is unknown; use zigzag or adaptive");
}

const char* to_string(Placement placement) { return placement == Placement::zigzag ? "zigzag" : "adaptive"; }

double causal_pairs(int64_t begin, int64_t end) {
  if (end <= begin) return 0.0;
  const double a = static_cast<double>(begin), b = static_cast<double>(end);
  return (b * (b + 1) - a * (a + 1)) / 2;
}

double zigzag_pairs(int64_t length, int64_t padded, int ring, int ring_rank) {
  const int64_t chunk = padded / (2 * int64_t{ring});
  double pairs = 0.0;
  for (const int64_t k : {int64_t{ring_rank}, 2 * int64_t{ring} - 1 - ring_rank})
    pairs += causal_pairs(k * chunk, std::min((k + 1) * chunk, length));
  return pairs;
}

std::vector<int64_t> split_share_counts(int64_t share, const std::vector<int64_t>& whole) {
  const int64_t U = static_cast<int64_t>(whole.size());
  MMSP_ASSERT(U >= 1 && share >= 0);
  // Lowest level such that topping every rank up to it holds the share.
  auto room = [&](int64_t level) {
    int64_t r = 0;
    for (int64_t w : whole) r += std::max<int64_t>(0, level - w);
    return r;
  };
  int64_t lo = 0, hi = *std::max_element(whole.begin(), whole.end()) + (share + U - 1) / U;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (room(mid) >= share)
      hi = mid;
    else
      lo = mid + 1;
  }
  std::vector<int64_t> counts(U, 0);
  int64_t left = share;
  for (int64_t u = 0; u < U; ++u) {
    counts[u] = std::min(left, std::max<int64_t>(0, lo - whole[u]));
    left -= counts[u];
  }
  MMSP_ASSERT(left == 0);
  return counts;
}

namespace {

int64_t split_padded(int64_t length, int ring) {
  const int64_t multiple = 2 * int64_t{ring};
  return (length + multiple - 1) / multiple * multiple;
}

// The row's totals that every candidate is measured against.
struct RowTotals {
  int64_t tokens = 0;  // real
  double pairs = 0.0;
};

// Splits the first `split` segments of `order` (longest first) and places the others whole,
// longest first, each on the context rank where the larger of its normalised token and work
// loads stays lowest. Returns whether the result meets the options.
bool try_split(const std::vector<int64_t>& lengths, const std::vector<int64_t>& order, size_t split, int R, int U,
               const RowTotals& totals, const PlacementOptions& options, std::vector<int>& home) {
  const int S = R * U;
  home.assign(lengths.size(), -1);
  int64_t share = 0;  // split tokens (with their zigzag padding) per ring rank
  std::vector<double> work(S, 0.0);
  for (size_t k = 0; k < split; ++k) {
    const int64_t n = lengths[order[k]], padded = split_padded(n, R);
    share += padded / R;
    for (int r = 0; r < R; ++r) {
      const double w = zigzag_pairs(n, padded, R, r) / U;  // Ulysses splits the heads
      for (int u = 0; u < U; ++u) work[r * U + u] += w;
    }
  }
  const double token_mean = std::max(1.0, static_cast<double>(totals.tokens) / S);
  const double work_mean = std::max(1.0, totals.pairs / S);
  const double split_tokens = static_cast<double>(share) / U;
  std::vector<int64_t> whole(S, 0), ring_whole(R, 0);
  const double per_token = 1.0 / token_mean, per_pair = 1.0 / work_mean;
  for (size_t k = split; k < order.size(); ++k) {
    const int64_t n = lengths[order[k]];
    const double w = causal_pairs(0, n);
    int best = 0;
    double best_score = 0.0;
    for (int r = 0; r < R; ++r) {
      // Tokens count per ring rank, whose split share evens them over its ulysses ranks (as
      // far as it reaches), and per rank beyond the share; work is the rank's own.
      const double ring_score = (split_tokens + static_cast<double>(ring_whole[r] + n) / U) * per_token;
      for (int c = r * U; c < (r + 1) * U; ++c) {
        const double own = (static_cast<double>(whole[c] + n) - split_tokens) * per_token;
        const double score = std::max(std::max(ring_score, own), (work[c] + w) * per_pair);
        if (c == 0 || score < best_score) best = c, best_score = score;
      }
    }
    home[order[k]] = best;
    whole[best] += n;
    ring_whole[best / U] += n;
    work[best] += w;
  }
  int64_t local_length = 0;
  for (int r = 0; r < R; ++r) {
    const std::vector<int64_t> mine(whole.begin() + r * U, whole.begin() + (r + 1) * U);
    const std::vector<int64_t> counts = split_share_counts(share, mine);
    for (int u = 0; u < U; ++u) local_length = std::max(local_length, counts[u] + mine[u]);
  }
  const double padding = static_cast<double>(local_length) * S - static_cast<double>(totals.tokens);
  const double work_max = *std::max_element(work.begin(), work.end());
  return padding <= options.max_padding * static_cast<double>(totals.tokens) &&
         work_max <= options.max_work_ratio * (totals.pairs / S);
}

}  // namespace

std::vector<int> place_segments(const std::vector<int64_t>& lengths, int ring, int ulysses, Placement placement,
                                const PlacementOptions& options) {
  MMSP_CHECK(ring >= 1 && ulysses >= 1, "ring (", ring, ") and ulysses (", ulysses, ") must be >= 1");
  MMSP_CHECK(options.max_padding >= 0 && options.max_work_ratio >= 1, "placement tolerances: padding ",
             options.max_padding, " must be >= 0 and the work ratio ", options.max_work_ratio, " >= 1");
  std::vector<int> all_split(lengths.size(), -1);
  if (placement == Placement::zigzag || lengths.empty()) return all_split;
  RowTotals totals;
  for (int64_t n : lengths) {
    MMSP_CHECK(n >= 1, "segment length must be >= 1, got ", n);
    totals.tokens += n;
    totals.pairs += causal_pairs(0, n);
  }
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  // The fewest longest segments to split. Those that alone exceed a rank's share of tokens or
  // pairs cannot stay whole; beyond them, splitting more evens the load but pads each split
  // segment to 2R, so feasibility is not monotone in the count: gallop must, must + 1, + 2,
  // + 4, ... to the first count that meets the targets, then bisect below it (keeping a count
  // that meets them). All split is zigzag, accepted whatever its balance.
  const size_t n = order.size();
  const double S = static_cast<double>(ring) * ulysses;
  size_t must = 0;
  while (must < n && (static_cast<double>(lengths[order[must]]) > (1 + options.max_padding) * totals.tokens / S ||
                      causal_pairs(0, lengths[order[must]]) > options.max_work_ratio * totals.pairs / S))
    ++must;
  std::vector<int> home, best = all_split;
  size_t lo = must, hi = n;  // hi meets the targets (or is n)
  for (size_t extra = 0;; extra = extra == 0 ? 1 : 2 * extra) {
    const size_t k = std::min(n, must + extra);
    if (k == n) break;
    if (try_split(lengths, order, k, ring, ulysses, totals, options, home)) {
      if (k == must) return home;
      hi = k;
      best = home;
      break;
    }
    lo = k;
  }
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    if (try_split(lengths, order, mid, ring, ulysses, totals, options, home)) {
      hi = mid;
      best = home;
    } else {
      lo = mid;
    }
  }
  return best;
}

}  // namespace mmsp::plan
