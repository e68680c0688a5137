// Encoding and comparison of the flags every rank must share; see flag_agreement.h.
#include "mmsp/dist/flag_agreement.h"

#include <cstdio>
#include <cstdlib>
#include <map>

namespace mmsp::dist {
namespace {

void put(std::string& out, const std::string& s) { out += std::to_string(s.size()) + ":" + s; }

bool take(const std::string& text, size_t& at, std::string& out) {
  const size_t colon = text.find(':', at);
  if (colon == std::string::npos || colon == at || colon - at > 9) return false;
  size_t n = 0;
  for (size_t i = at; i < colon; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    n = n * 10 + static_cast<size_t>(text[i] - '0');
  }
  if (n > text.size() - colon - 1) return false;
  out = text.substr(colon + 1, n);
  at = colon + 1 + n;
  return true;
}

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string encode_flags(const AgreedFlags& flags) {
  std::string out;
  for (const auto& [flag, value] : flags) {
    put(out, flag);
    put(out, value);
  }
  return out;
}

bool decode_flags(const std::string& text, AgreedFlags& out) {
  out.clear();
  size_t at = 0;
  while (at < text.size()) {
    std::string flag, value;
    if (!take(text, at, flag) || !take(text, at, value)) return false;
    out.emplace_back(std::move(flag), std::move(value));
  }
  return true;
}

std::string exact_number(double value) {
  char buffer[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof buffer, "%.*g", digits, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

std::string value_disagreement(const std::vector<AgreedFlags>& per_rank, const RankNamer& name_ranks) {
  if (per_rank.size() < 2) return "";
  const RankNamer name = name_ranks ? name_ranks : RankNamer(rank_list);
  // Flags that differ, each with its values and the ranks that hold them (in rank order).
  const AgreedFlags& first = per_rank[0];
  std::vector<int> shaped_otherwise;
  for (size_t r = 1; r < per_rank.size(); ++r) {
    bool same_shape = per_rank[r].size() == first.size();
    for (size_t i = 0; same_shape && i < first.size(); ++i) same_shape = per_rank[r][i].first == first[i].first;
    if (!same_shape) shaped_otherwise.push_back(static_cast<int>(r));
  }
  std::string out;
  if (!shaped_otherwise.empty()) {
    out = name(shaped_otherwise) + " sent another list of flags than rank 0 (another mmsp version?)";
  } else {
    for (size_t i = 0; i < first.size(); ++i) {
      std::vector<std::pair<std::string, std::vector<int>>> values;  // in order of first appearance
      for (size_t r = 0; r < per_rank.size(); ++r) {
        const std::string& v = per_rank[r][i].second;
        auto it = values.begin();
        while (it != values.end() && it->first != v) ++it;
        if (it == values.end()) values.push_back({v, {}}), it = values.end() - 1;
        it->second.push_back(static_cast<int>(r));
      }
      if (values.size() == 1) continue;
      out += out.empty() ? "" : "; ";
      out += first[i].first + " is";
      for (size_t k = 0; k < values.size(); ++k)
        out += (k == 0                   ? " "
                : k + 1 == values.size() ? " and "
                                         : ", ") +
               (values[k].first.empty() ? std::string("(unset)") : values[k].first) + " on " + name(values[k].second);
    }
  }
  return out;
}

std::string flag_disagreement(const std::vector<AgreedFlags>& per_rank, const RankNamer& name_ranks) {
  const std::string out = value_disagreement(per_rank, name_ranks);
  if (out.empty()) return "";
  return "the ranks were started with different flags: " + out +
         ". Every rank must run the same command (a wrapper that adds a flag on some ranks only trains replicas "
         "that diverge); stopped before the first collective";
}

}  // namespace mmsp::dist
