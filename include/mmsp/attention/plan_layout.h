// The bridge from the plan to attention: token layouts (segment, order) of each
// rank's slots, read from the plan's shard map. No communication: every rank
// derives every other rank's layout from the same plan.
#pragma once

#include <vector>

#include "mmsp/attention/token_layout.h"
#include "mmsp/plan/shard_map.h"

namespace mmsp::attention {

// Layout of one context rank's local slots (padding: segment -1).
TokenLayout local_layout(const plan::ShardMap& shards, int context_rank);

// Layout of each ring rank's share: its ulysses ranks' slots joined in order.
std::vector<TokenLayout> ring_shares(const plan::ShardMap& shards);

// Split slots of each context rank when the placement holds some segment whole (only those
// are exchanged: step_attention.h); empty when every segment is split (zigzag).
std::vector<int64_t> split_slots(const plan::ShardMap& shards);

// Layout of the whole packed row (the single-process view).
TokenLayout row_layout(const plan::PackedRow& row);

}  // namespace mmsp::attention
