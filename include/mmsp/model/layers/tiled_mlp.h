// Tiled MLP (ALST, arXiv 2506.13996): a token-wise layer run over tiles of its tokens,
// forward and backward, so that its intermediate ([tokens, intermediate], 18,944 wide
// for Qwen2-VL-7B: 1.2 GB in bf16 at 32k tokens, three of them in the backward) never
// exists for more than one tile. The forward keeps only the input; the backward runs
// each tile's forward again with grad and backpropagates it at once, so the weights'
// gradients are summed over tiles (in the weights' dtype: one rounding per tile under
// bfloat16; exact to rounding in fp64). Nothing here depends on the rank: a token-wise
// layer's tiles need no collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mmsp::model {

// --tiled-mlp: off (0), auto (kAutoMlpTile) or N tokens per tile.
constexpr int64_t kAutoMlpTile = -1;
int64_t parse_mlp_tile(const std::string& text);
std::string mlp_tile_name(int64_t setting);

// The tile for `tokens` rows of a layer of width `hidden`: N as set, or for auto ALST's
// rule, tiles of at most `hidden` tokens, of equal sizes (so that one tile's intermediate
// is the size of one of the MLP's own weight matrices, which the rank holds anyway);
// 0 (off) stays 0.
int64_t mlp_tile_tokens(int64_t setting, int64_t tokens, int64_t hidden);

// The layer as a function of its input [tokens, …] and its weights (undefined entries:
// absent biases), so that the backward can hand it stand-ins that collect the gradients.
using TokenwiseFn = std::function<at::Tensor(const at::Tensor& x, const std::vector<at::Tensor>& weights)>;

// fn(x, weights) over tiles of `tile` tokens (dim 0) of x, forward and backward. `fn` must
// be token-wise (row i of the output depends on row i of x alone) and deterministic, and
// must capture by value what it reads: it runs again in the backward.
at::Tensor tiled_over_tokens(TokenwiseFn fn, const at::Tensor& x, const std::vector<at::Tensor>& weights, int64_t tile);

}  // namespace mmsp::model
