// Vision routes: which embedding rows each encoding rank sends to each rank that holds
// the rows' placeholder tokens, and the local slots where received rows land. The same
// routes carry the deepstack features. Rows go in the receiver's slot order, so both
// sides derive the same order without talking.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "mmsp/plan/sequence.h"
#include "mmsp/plan/shard_map.h"
#include "mmsp/plan/vision_assignment.h"

namespace mmsp::plan {

// Placeholder tokens of an item that are consecutive in the packed row.
struct VisionPiece {
  int64_t packed = 0;
  int64_t length = 0;
  int64_t first_row = 0;  // embedding row of the item at `packed`
};

// One image or video of a packed row.
struct VisionItem {
  int64_t sequence = 0;  // batch index of its sequence
  VisionKind kind = VisionKind::image;
  int64_t index = 0;         // among its sequence's images (or videos)
  int64_t batch_index = 0;   // among the batch's images (or videos): its image_grid_thw row overall
  Grid grid{1, 1, 1};        // in patches
  int64_t rows = 0;          // embedding rows (placeholder tokens)
  int64_t patches = 0;       // t*h*w: rows of the Qwen flattened pixel_values
  int64_t patch_offset = 0;  // first patch row among the batch's pixel rows of its kind
  double cost = 0.0;         // estimated encoder cost
  int preferred_rank = 0;    // context rank holding most of its placeholder tokens
  int encoder_rank = 0;      // context rank that encodes it (Vision DP); -1 when split
  int64_t encoder_row = 0;   // first row of its embeddings in that rank's encoder output
  std::vector<VisionPiece> pieces;
  // Vision-tower SP (vision_split.h): an item split over the context group has
  // shard_rows [S + 1], context rank r encoding its rows [shard_rows[r], shard_rows[r + 1])
  // at shard_encoder_row[r] of r's encoder output (after r's whole items). Empty when
  // the item is encoded whole by encoder_rank.
  std::vector<int64_t> shard_rows, shard_encoder_row;

  bool split() const { return !shard_rows.empty(); }
  // The context rank that encodes embedding row `row`, and the row's place in its output.
  std::pair<int, int64_t> source_of(int64_t row) const;
  // Rows context rank r encodes: all of them (its encoder), its shard (split), or none.
  int64_t rows_encoded_by(int rank) const;
};

// One routed row. Slots and rows are local to the two ranks; ranks are context ranks.
struct RouteRow {
  int64_t item = 0;     // index into the row's items
  int64_t row = 0;      // embedding row of the item
  int64_t src_row = 0;  // row in the sender's encoder output
  int64_t slot = 0;     // local slot on the receiver
};

struct RankRoutes {
  std::vector<std::vector<RouteRow>> send;  // [dst context rank], in the dst's slot order
  std::vector<std::vector<RouteRow>> recv;  // [src context rank], in arrival (= slot) order
  std::vector<int64_t> visual_slots;        // every placeholder slot of this rank, ascending
  std::vector<int64_t> encoder_items;       // items this rank encodes whole, in encoder order
  std::vector<int64_t> split_items;         // items every context rank encodes a shard of, in order
  int64_t encoder_rows = 0;                 // rows its encoder outputs: whole items', then its shards'
};

// Placeholder pieces of all items in packed order: (piece, item) pairs.
struct FlatPiece {
  VisionPiece piece;
  int64_t item = 0;
};
std::vector<FlatPiece> flatten_pieces(const std::vector<VisionItem>& items);

// Routes of one context rank; `pieces` is flatten_pieces(items).
RankRoutes make_rank_routes(const std::vector<VisionItem>& items, const std::vector<FlatPiece>& pieces,
                            const ShardMap& shards, int context_rank);

// Placeholder rows of an item on each context rank that holds some.
HeldRows held_rows(const VisionItem& item, const ShardMap& shards);

// Context rank holding most of an item's placeholder tokens (ties: the lower rank).
int holder_rank(const VisionItem& item, const ShardMap& shards);
int holder_rank(const HeldRows& held);

}  // namespace mmsp::plan
