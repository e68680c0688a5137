// Vision DP assignment: balanced by estimated encoder cost (ours) and the Python
// patches' greedy contiguous rule by patch count (for comparison and as a floor).
#include "mmsp/plan/vision_assignment.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "mmsp/core/check.h"

namespace mmsp::plan {

double encoder_cost(const Grid& g, const VisionCostModel& model) {
  const double hw = static_cast<double>(g[1]) * static_cast<double>(g[2]);
  const double t = static_cast<double>(g[0]);
  return t * hw + model.attention_weight * t * hw * hw;
}

double max_over_mean(const std::vector<double>& values) {
  if (values.empty()) return 1.0;
  const double sum = std::accumulate(values.begin(), values.end(), 0.0);
  if (sum <= 0) return 1.0;
  return *std::max_element(values.begin(), values.end()) / (sum / values.size());
}

VisionAssignment evaluate_assignment(const std::vector<int>& rank_of_item, const std::vector<double>& costs,
                                     int ranks) {
  MMSP_ASSERT(rank_of_item.size() == costs.size());
  VisionAssignment a;
  a.rank_of_item = rank_of_item;
  a.load.assign(ranks, 0.0);
  for (size_t i = 0; i < costs.size(); ++i) {
    MMSP_ASSERT(rank_of_item[i] >= 0 && rank_of_item[i] < ranks);
    a.load[rank_of_item[i]] += costs[i];
  }
  a.max_over_mean = max_over_mean(a.load);
  return a;
}

void check_encoder_patches(const std::vector<int64_t>& patch_counts, const std::vector<int>& rank_of_item, int ranks,
                           int dp) {
  MMSP_ASSERT(patch_counts.size() == rank_of_item.size());
  std::vector<int64_t> total(ranks, 0);
  for (size_t i = 0; i < patch_counts.size(); ++i) total[rank_of_item[i]] += patch_counts[i];
  for (int r = 0; r < ranks; ++r)
    MMSP_CHECK(total[r] <= std::numeric_limits<int32_t>::max(), "dp row ", dp, ": context rank ", r, " would encode ",
               total[r], " patches in one vision-encoder call whose ", "cu_seqlens are int32 (at most ",
               std::numeric_limits<int32_t>::max(), "): use a larger context group or fewer images per step");
}

std::vector<int> assign_greedy_contiguous(const std::vector<int64_t>& patch_counts, int ranks) {
  MMSP_CHECK(ranks >= 1, "Vision DP needs >= 1 rank, got ", ranks);
  const int64_t n = static_cast<int64_t>(patch_counts.size());
  std::vector<int> out(n, ranks - 1);
  double remaining = 0;
  for (int64_t pc : patch_counts) remaining += static_cast<double>(pc);
  int64_t i = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t ranks_left = ranks - r, items_left = n - i;
    if (items_left <= 0) break;
    const double target = remaining / static_cast<double>(ranks_left);
    const int64_t max_items = items_left - (ranks_left - 1);  // leave one per remaining rank
    double load = 0;
    for (int64_t taken = 0; i < n && taken < max_items;) {
      out[i] = r;
      load += static_cast<double>(patch_counts[i]);
      ++i;
      ++taken;
      if (load >= target) break;  // the item that crosses the target is kept
    }
    remaining -= load;
  }
  return out;
}

namespace {

// Moves or swaps items off the most loaded rank while that lowers it; bounded passes.
// A move goes to the lightest rank; a swap with rank t wants an item cheaper by about
// half the gap, found by binary search in t's items sorted by cost.
void refine(std::vector<int>& encoder_of, std::vector<double>& load, const std::vector<double>& costs, int ranks) {
  const int64_t n = static_cast<int64_t>(costs.size());
  const double eps = 1e-9 * (std::accumulate(load.begin(), load.end(), 0.0) + 1.0);
  std::vector<std::vector<int64_t>> on(ranks);  // items per rank, ascending cost
  for (int64_t i = 0; i < n; ++i) on[encoder_of[i]].push_back(i);
  auto by_cost = [&](int64_t a, int64_t b) { return costs[a] < costs[b] || (costs[a] == costs[b] && a < b); };
  for (auto& v : on) std::sort(v.begin(), v.end(), by_cost);
  auto take = [&](int r, int64_t i) { on[r].erase(std::find(on[r].begin(), on[r].end(), i)); };
  auto put = [&](int r, int64_t i) { on[r].insert(std::upper_bound(on[r].begin(), on[r].end(), i, by_cost), i); };
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / ranks;
  for (int pass = 0; pass < ranks + 16; ++pass) {
    const int M = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    if (load[M] <= mean * (1 + 1e-3)) return;  // balanced to 0.1%: more passes buy nothing
    const int lightest = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    double best = load[M] - eps;
    int64_t move_i = -1, swap_j = -1;
    int move_to = -1;
    if (lightest != M) {
      for (int64_t i : on[M]) {
        const double worst = std::max(load[M] - costs[i], load[lightest] + costs[i]);
        if (worst < best) best = worst, move_i = i, move_to = lightest;
      }
    }
    if (move_i < 0) {
      // The best swap partners are the lightest ranks; looking at a few keeps a pass cheap.
      std::vector<int> light(ranks);
      std::iota(light.begin(), light.end(), 0);
      const int probe = std::min(ranks, 8);
      std::partial_sort(light.begin(), light.begin() + probe, light.end(),
                        [&](int a, int b) { return load[a] < load[b] || (load[a] == load[b] && a < b); });
      for (int k = 0; k < probe; ++k) {
        const int t = light[k];
        if (t == M || on[t].empty()) continue;
        const double half_gap = (load[M] - load[t]) / 2;
        for (int64_t i : on[M]) {
          // want costs[j] close to costs[i] - half_gap (and below costs[i])
          const double want = costs[i] - half_gap;
          auto it =
              std::lower_bound(on[t].begin(), on[t].end(), want, [&](int64_t j, double v) { return costs[j] < v; });
          for (int side = 0; side < 2; ++side) {
            if (side == 1) {
              if (it == on[t].begin()) break;
              --it;
            }
            if (it == on[t].end()) continue;
            const int64_t j = *it;
            const double d = costs[i] - costs[j];
            if (d <= 0) continue;
            const double worst = std::max(load[M] - d, load[t] + d);
            if (worst < best) best = worst, move_i = i, swap_j = j, move_to = t;
          }
        }
      }
    }
    if (move_i < 0) return;
    load[M] -= costs[move_i];
    load[move_to] += costs[move_i];
    encoder_of[move_i] = move_to;
    take(M, move_i);
    put(move_to, move_i);
    if (swap_j >= 0) {
      load[move_to] -= costs[swap_j];
      load[M] += costs[swap_j];
      encoder_of[swap_j] = M;
      take(move_to, swap_j);
      put(M, swap_j);
    }
  }
}

// Swaps two near-equal items that each sit away from their preferred rank when that
// brings one of them home without raising the largest load.
void prefer_holders(std::vector<int>& encoder_of, std::vector<double>& load, const std::vector<double>& costs,
                    const std::vector<int>& preferred, int ranks, double tolerance) {
  const int64_t n = static_cast<int64_t>(costs.size());
  std::vector<std::vector<int64_t>> on(ranks);
  for (int64_t i = 0; i < n; ++i) on[encoder_of[i]].push_back(i);
  const double top = *std::max_element(load.begin(), load.end());
  for (int64_t i = 0; i < n; ++i) {
    const int p = preferred[i], a = encoder_of[i];
    if (p < 0 || p >= ranks || p == a) continue;
    for (int64_t j : on[p]) {
      if (encoder_of[j] == preferred[j]) continue;
      if (std::abs(costs[i] - costs[j]) > tolerance * std::max(costs[i], costs[j])) continue;
      const double la = load[a] - costs[i] + costs[j], lp = load[p] - costs[j] + costs[i];
      if (std::max(la, lp) > top) continue;
      load[a] = la;
      load[p] = lp;
      encoder_of[i] = p;
      encoder_of[j] = a;
      on[p].erase(std::find(on[p].begin(), on[p].end(), j));
      on[p].push_back(i);
      on[a].erase(std::find(on[a].begin(), on[a].end(), i));
      on[a].push_back(j);
      break;
    }
  }
}

}  // namespace

VisionAssignment assign_vision_balanced(const std::vector<double>& costs, const std::vector<int64_t>& patch_counts,
                                        const std::vector<int>& preferred_rank, int ranks,
                                        const VisionCostModel& model) {
  MMSP_CHECK(ranks >= 1, "Vision DP needs >= 1 rank, got ", ranks);
  const int64_t n = static_cast<int64_t>(costs.size());
  MMSP_ASSERT(static_cast<int64_t>(patch_counts.size()) == n && static_cast<int64_t>(preferred_rank.size()) == n);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(ranks, 0.0);
  std::vector<int> encoder_of(n, 0);
  for (int64_t i : order) {
    const int lightest = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    int chosen = lightest;
    const int p = preferred_rank[i];
    if (p >= 0 && p < ranks && load[p] <= load[lightest] + model.tie_tolerance * costs[i]) chosen = p;
    encoder_of[i] = chosen;
    load[chosen] += costs[i];
  }
  refine(encoder_of, load, costs, ranks);
  prefer_holders(encoder_of, load, costs, preferred_rank, ranks, model.tie_tolerance);
  VisionAssignment ours = evaluate_assignment(encoder_of, costs, ranks);
  VisionAssignment greedy = evaluate_assignment(assign_greedy_contiguous(patch_counts, ranks), costs, ranks);
  const double ours_max = *std::max_element(ours.load.begin(), ours.load.end());
  const double greedy_max = *std::max_element(greedy.load.begin(), greedy.load.end());
  if (greedy_max < ours_max * (1 - 1e-12)) {
    greedy.used_greedy_fallback = true;
    return greedy;
  }
  return ours;
}

namespace {

int64_t rows_on(const HeldRows& held, int rank) {
  for (const auto& [r, rows] : held)
    if (r == rank) return rows;
  return 0;
}

}  // namespace

void keep_rows_home(VisionAssignment& a, const std::vector<double>& costs, const std::vector<HeldRows>& held, int ranks,
                    const VisionCostModel& model) {
  const int64_t n = static_cast<int64_t>(costs.size());
  MMSP_ASSERT(static_cast<int64_t>(held.size()) == n && static_cast<int64_t>(a.rank_of_item.size()) == n);
  std::vector<int>& encoder_of = a.rank_of_item;
  std::vector<double> load(ranks, 0.0);
  std::vector<std::vector<int64_t>> on(ranks);
  for (int64_t i = 0; i < n; ++i) load[encoder_of[i]] += costs[i], on[encoder_of[i]].push_back(i);
  const double top = n ? *std::max_element(load.begin(), load.end()) : 0.0;
  const double limit = top * (1 + 1e-12);
  auto relocate = [&](int64_t i, int from, int to) {
    on[from].erase(std::find(on[from].begin(), on[from].end(), i));
    on[to].push_back(i);
    load[from] -= costs[i];
    load[to] += costs[i];
    encoder_of[i] = to;
  };
  // Each accepted change keeps more rows home, so the passes end; few are needed.
  for (int pass = 0; pass < 4; ++pass) {
    bool changed = false;
    for (int64_t i = 0; i < n; ++i) {
      const int a_rank = encoder_of[i];
      const int64_t here = rows_on(held[i], a_rank);
      for (const auto& [b, rows_b] : held[i]) {
        if (b == a_rank || rows_b <= here) continue;
        if (load[b] + costs[i] <= limit) {  // room at b: just move
          relocate(i, a_rank, b);
          changed = true;
          break;
        }
        int64_t best_j = -1, best_gain = 0;
        for (int64_t j : on[b]) {
          if (std::abs(costs[i] - costs[j]) > model.tie_tolerance * std::max(costs[i], costs[j])) continue;
          if (load[a_rank] - costs[i] + costs[j] > limit || load[b] - costs[j] + costs[i] > limit) continue;
          const int64_t gain = rows_b - here + rows_on(held[j], a_rank) - rows_on(held[j], b);
          if (gain > best_gain) best_gain = gain, best_j = j;
        }
        if (best_j >= 0) {
          relocate(i, a_rank, b);
          relocate(best_j, b, a_rank);
          changed = true;
          break;
        }
      }
    }
    if (!changed) break;
  }
  const bool fallback = a.used_greedy_fallback;
  a = evaluate_assignment(encoder_of, costs, ranks);
  a.used_greedy_fallback = fallback;
}

}  // namespace mmsp::plan
