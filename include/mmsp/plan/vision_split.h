// Vision-tower sequence parallelism: an item too large for one rank (a 4K page, a long
// video) is encoded by every rank of its context group together. Each rank takes a
// contiguous range of the item's embedding rows — whole spatial-merge windows, so the
// merger and the routing stay local — and the tower's attention sees the whole item
// through an all-to-all from patches to heads (model/vision/vision_tower.h). Small items stay
// whole on one rank (Vision DP, vision_assignment.h); one plan mixes both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mmsp/plan/model_conventions.h"
#include "mmsp/plan/vision_routes.h"

namespace mmsp::plan {

struct VisionSplitOptions {
  enum class Mode {
    off,        // every item whole (Vision DP alone)
    automatic,  // the cost model decides (split_by_cost)
    forced,     // every item of at least min_patches patches
  };
  Mode mode = Mode::off;
  int64_t min_patches = 0;  // forced only; >= 1
  // automatic never splits an item below this many patches (a 896 × 896 image at 14 px):
  // for smaller items the exchanges cost more than the memory they spread.
  static constexpr int64_t kAutomaticFloor = 4096;
};

// "off", "auto" or a patch count (>= 1): the command-line spelling. Throws naming the value.
VisionSplitOptions parse_vision_split(const std::string& text);
std::string to_string(const VisionSplitOptions& options);

// Embedding rows of the smallest piece a rank can take of `item`: one merge window (1 row),
// or a whole frame (InternVL's tiles: rows / t).
int64_t split_unit_rows(const VisionItem& item, const ModelConventions& conventions);

// Why `item` cannot be split over `ranks` ranks of this family's tower; empty when it
// can. Rules: the family's tower splits at all (ModelConventions::vision_heads,
// vision_split_by_frames); with the attention exchanged, the heads divide by the ranks
// (the all-to-all gives each rank H / ranks heads); every rank gets at least one unit
// (a merge window, or a frame).
std::string unsplittable_reason(const VisionItem& item, int ranks, const ModelConventions& conventions);

// The automatic rule: an item is split when its estimated encoder cost is more than a
// rank's fair share of the row's (total / ranks) — no assignment of whole items can then
// balance the group — and it has at least kAutomaticFloor patches.
bool split_by_cost(const VisionItem& item, double total_cost, int ranks);

// Which items of one dp row the options split (and can be split): one flag per item. The
// items the rule picks but that cannot be split are named in `kept_whole` with the reason.
std::vector<bool> choose_split_items(const std::vector<VisionItem>& items, int ranks,
                                     const ModelConventions& conventions, const VisionSplitOptions& options,
                                     std::vector<std::string>* kept_whole = nullptr);

// Each rank's rows of a split item: its units as evenly as they go (shard_boundaries),
// in embedding rows.
std::vector<int64_t> split_item_rows(const VisionItem& item, int ranks, const ModelConventions& conventions);

// `rows` over `ranks` as evenly as whole rows allow, the first ranks taking one more:
// boundaries [ranks + 1], from 0 to rows.
std::vector<int64_t> shard_boundaries(int64_t rows, int ranks);

}  // namespace mmsp::plan
