// Which items vision-tower SP splits, and each rank's rows of them; see vision_split.h.
#include "mmsp/plan/vision_split.h"

#include <cctype>
#include <limits>

#include "mmsp/core/check.h"

namespace mmsp::plan {

VisionSplitOptions parse_vision_split(const std::string& text) {
  VisionSplitOptions o;
  if (text == "off") return o;
  if (text == "auto") {
    o.mode = VisionSplitOptions::Mode::automatic;
    return o;
  }
  bool digits = !text.empty() && text.size() <= 18;
  for (char ch : text) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
  MMSP_CHECK(digits && std::stoll(text) >= 1, "--vision-split \"", text,
             "\" must be off, auto or a patch count >= 1 (items of at least that many patches are split)");
  o.mode = VisionSplitOptions::Mode::forced;
  o.min_patches = std::stoll(text);
  return o;
}

std::string to_string(const VisionSplitOptions& o) {
  switch (o.mode) {
    case VisionSplitOptions::Mode::off:
      return "off";
    case VisionSplitOptions::Mode::automatic:
      return "auto";
    case VisionSplitOptions::Mode::forced:
      return std::to_string(o.min_patches);
  }
  return "off";
}

int64_t split_unit_rows(const VisionItem& item, const ModelConventions& c) {
  if (c.vision_split_by_frames && c.vision_heads <= 0 && item.grid[0] > 0 && item.rows % item.grid[0] == 0)
    return item.rows / item.grid[0];
  return 1;
}

std::string unsplittable_reason(const VisionItem& item, int ranks, const ModelConventions& c) {
  if (ranks <= 1) return "the context group has one rank";
  if (c.vision_heads > 0) {
    if (c.vision_heads % ranks != 0)
      return detail::concat("its tower's ", c.vision_heads, " attention heads do not divide by the context group's ",
                            ranks, " ranks");
    if (item.rows < ranks)
      return detail::concat("it has ", item.rows, " merge windows (embedding rows), fewer than the context group's ",
                            ranks, " ranks");
    return {};
  }
  if (c.vision_split_by_frames) {
    if (item.grid[0] < ranks || item.rows % item.grid[0] != 0)
      return detail::concat("it has ", item.grid[0], " tiles (frames), fewer than the context group's ", ranks,
                            " ranks");
    return {};
  }
  return "this family's vision tower encodes items whole";
}

std::vector<int64_t> split_item_rows(const VisionItem& item, int ranks, const ModelConventions& c) {
  const int64_t unit = split_unit_rows(item, c);
  std::vector<int64_t> b = shard_boundaries(item.rows / unit, ranks);
  for (int64_t& x : b) x *= unit;
  return b;
}

bool split_by_cost(const VisionItem& item, double total_cost, int ranks) {
  return item.patches >= VisionSplitOptions::kAutomaticFloor && item.cost > total_cost / ranks;
}

std::vector<bool> choose_split_items(const std::vector<VisionItem>& items, int ranks, const ModelConventions& c,
                                     const VisionSplitOptions& options, std::vector<std::string>* kept_whole) {
  std::vector<bool> split(items.size(), false);
  if (options.mode == VisionSplitOptions::Mode::off || ranks <= 1) return split;
  double total = 0;
  for (const VisionItem& it : items) total += it.cost;
  for (size_t i = 0; i < items.size(); ++i) {
    const VisionItem& it = items[i];
    const bool wanted = options.mode == VisionSplitOptions::Mode::forced ? it.patches >= options.min_patches
                                                                         : split_by_cost(it, total, ranks);
    if (!wanted) continue;
    const std::string why = unsplittable_reason(it, ranks, c);
    split[i] = why.empty();
    if (!split[i] && kept_whole)
      kept_whole->push_back(
          detail::concat(to_string(it.kind), " ", it.batch_index, " (", it.patches, " patches) stays whole: ", why));
  }
  return split;
}

std::vector<int64_t> shard_boundaries(int64_t rows, int ranks) {
  MMSP_ASSERT(ranks >= 1 && rows >= 0);
  std::vector<int64_t> b(ranks + 1, 0);
  const int64_t base = rows / ranks, extra = rows % ranks;
  for (int r = 0; r < ranks; ++r) b[r + 1] = b[r] + base + (r < extra ? 1 : 0);
  return b;
}

}  // namespace mmsp::plan
