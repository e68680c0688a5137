// Gated DeltaNet over sequence tiles: ALST's tiled compute carried to a token mixer
// that is not token-wise. The conv reads the W−1 rows before each token and the rule
// carries a state from token to token, so a share of T rows is cut into tiles that run in
// order, each reading its W−1 rows of context and starting its first run from the state
// the tile before it left. The forward keeps the inputs and one state per tile border
// ([H, K, V]); the backward runs the tiles again last to first, each with grad, handing
// the gradient of its initial state to the tile before it. No tensor of the mixer's
// intermediates (the conv's three, the rule's q, k, gates and output) exists for more than
// one tile: at 32k rows of Qwen3.5-0.8B's 16 heads that is 3 GB in bf16 a layer.
//
// Tiles run only where a rank's share is whole (no ring: one rank holds each run from its
// segment start); under a ring the runs' states come from other ranks in one exchange
// (gated_delta_ring.h) and the share runs whole.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "mmsp/attention/linear/gated_delta_ring.h"

namespace mmsp::attention {

// One tile of a share: rows [begin, begin + length), read with `context` rows before it.
struct SequenceTile {
  int64_t begin = 0, length = 0;
  int64_t context = 0;     // rows before `begin` the conv reads (W − 1, fewer at the share's start)
  RingRunIndex conv;       // over rows [begin − context, begin + length), as one rank with no ring
  RunChunks chunks;        // the rule's chunk slots over the tile's own rows (chunks.runs: its runs)
  bool continues = false;  // its first run goes on from the tile before (starts from that state)
  bool carries = false;    // its last run goes on into the next tile (hands over its final state)
};

// The tiles of a share whose runs (token_runs of its layout) all start their segments:
// ceil(tokens / tile) tiles of `tile` rows (the last shorter). Throws, naming the run,
// for a run that starts mid-segment (a ring's share).
std::vector<SequenceTile> plan_sequence_tiles(const std::vector<TokenRun>& runs, int64_t tokens, int64_t tile,
                                              int64_t conv_kernel, int64_t chunk, const at::Device& device);

// The tile for a share of `tokens` rows: `setting` rows (>= 1), or for kAutoSequenceTile
// tiles of at most `hidden` rows of equal size, rounded up to whole chunks (a tile border
// inside a chunk costs a partial chunk more; any size is exact).
constexpr int64_t kAutoSequenceTile = -1;
int64_t sequence_tile_rows(int64_t setting, int64_t tokens, int64_t hidden, int64_t chunk);

// One tile's computation: rows [context + length, …] of the inputs, the weights (or
// stand-ins collecting their gradients), the tile, and its first run's initial state
// [H, K, V] (undefined unless tile.continues) -> (o [length, H, V], the final state of
// its last run [H, K, V], undefined unless tile.carries). Must be deterministic and
// capture by value what it reads: it runs again in the backward.
using SequenceTileFn =
    std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& rows, const std::vector<at::Tensor>& weights,
                                                    const SequenceTile& tile, const at::Tensor& initial)>;

// fn over the tiles in order, forward and backward: inputs [T, …] -> o [T, H, V].
at::Tensor sequence_tiled(SequenceTileFn fn, const at::Tensor& inputs, const std::vector<at::Tensor>& weights,
                          std::shared_ptr<const std::vector<SequenceTile>> tiles);

}  // namespace mmsp::attention
