// Routes of embedding rows from encoding ranks to placeholder-holding ranks.
#include "mmsp/plan/vision_routes.h"

#include <algorithm>

#include "mmsp/core/check.h"

namespace mmsp::plan {

std::vector<FlatPiece> flatten_pieces(const std::vector<VisionItem>& items) {
  std::vector<FlatPiece> out;
  for (size_t i = 0; i < items.size(); ++i)
    for (const VisionPiece& p : items[i].pieces) out.push_back({p, static_cast<int64_t>(i)});
  std::sort(out.begin(), out.end(),
            [](const FlatPiece& a, const FlatPiece& b) { return a.piece.packed < b.piece.packed; });
  return out;
}

HeldRows held_rows(const VisionItem& item, const ShardMap& shards) {
  // Few ranks hold any one item: a small list beats a per-rank array.
  HeldRows held;
  for (const VisionPiece& piece : item.pieces) {
    for (int64_t p = piece.packed, left = piece.length; left > 0;) {
      const SlotLocation loc = shards.locate(p);
      const int64_t n = std::min(left, loc.contiguous);
      auto it = std::find_if(held.begin(), held.end(), [&](const auto& h) { return h.first == loc.context_rank; });
      if (it == held.end())
        held.emplace_back(loc.context_rank, n);
      else
        it->second += n;
      p += n;
      left -= n;
    }
  }
  return held;
}

int holder_rank(const VisionItem& item, const ShardMap& shards) { return holder_rank(held_rows(item, shards)); }

std::pair<int, int64_t> VisionItem::source_of(int64_t row) const {
  if (!split()) return {encoder_rank, encoder_row + row};
  MMSP_ASSERT(row >= 0 && row < rows);
  const int r = static_cast<int>(std::upper_bound(shard_rows.begin(), shard_rows.end(), row) - shard_rows.begin()) - 1;
  return {r, shard_encoder_row[r] + row - shard_rows[r]};
}

int64_t VisionItem::rows_encoded_by(int rank) const {
  if (split()) return shard_rows.at(rank + 1) - shard_rows.at(rank);
  return encoder_rank == rank ? rows : 0;
}

int holder_rank(const HeldRows& held) {
  int best = 0;
  int64_t most = -1;
  for (const auto& [rank, count] : held)
    if (count > most || (count == most && rank < best)) best = rank, most = count;
  return best;
}

RankRoutes make_rank_routes(const std::vector<VisionItem>& items, const std::vector<FlatPiece>& pieces,
                            const ShardMap& shards, int me) {
  const int S = shards.ring() * shards.ulysses();
  RankRoutes out;
  out.send.resize(S);
  out.recv.resize(S);

  // Send: every row this rank encodes (whole items, then its shards of split items), to
  // the rank holding its placeholder.
  for (size_t i = 0; i < items.size(); ++i) {
    const VisionItem& item = items[i];
    const int64_t mine = item.rows_encoded_by(me);
    if (item.split())
      out.split_items.push_back(static_cast<int64_t>(i));
    else if (item.encoder_rank == me)
      out.encoder_items.push_back(static_cast<int64_t>(i));
    if (mine == 0) continue;
    out.encoder_rows += mine;
    for (const VisionPiece& piece : item.pieces) {
      for (int64_t p = piece.packed, row = piece.first_row, left = piece.length; left > 0;) {
        const SlotLocation loc = shards.locate(p);
        const int64_t n = std::min(left, loc.contiguous);
        auto& dst = out.send[loc.context_rank];
        for (int64_t k = 0; k < n; ++k) {
          const auto [src, src_row] = item.source_of(row + k);
          if (src == me) dst.push_back({static_cast<int64_t>(i), row + k, src_row, loc.slot + k});
        }
        p += n;
        row += n;
        left -= n;
      }
    }
  }
  for (auto& dst : out.send)
    std::sort(dst.begin(), dst.end(), [](const RouteRow& a, const RouteRow& b) { return a.slot < b.slot; });

  // Receive: walk this rank's slots; placeholder slots take rows in slot order.
  for (const SlotRun& run : shards.runs(me)) {
    if (run.segment < 0) continue;
    const int64_t lo = run.packed, hi = run.packed + run.length;
    auto it = std::upper_bound(pieces.begin(), pieces.end(), lo,
                               [](int64_t v, const FlatPiece& f) { return v < f.piece.packed; });
    if (it != pieces.begin()) --it;
    for (; it != pieces.end() && it->piece.packed < hi; ++it) {
      const int64_t a = std::max(lo, it->piece.packed);
      const int64_t b = std::min(hi, it->piece.packed + it->piece.length);
      if (a >= b) continue;
      const VisionItem& item = items[it->item];
      for (int64_t p = a; p < b; ++p) {
        const int64_t row = it->piece.first_row + (p - it->piece.packed);
        const int64_t slot = run.slot + (p - run.packed);
        const auto [src, src_row] = item.source_of(row);
        out.recv[src].push_back({it->item, row, src_row, slot});
        out.visual_slots.push_back(slot);
      }
    }
  }
  return out;
}

}  // namespace mmsp::plan
