// Tiled MLP as an autograd Function; see tiled_mlp.h.
#include "mmsp/model/layers/tiled_mlp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <utility>

#include "mmsp/core/check.h"

namespace mmsp::model {

int64_t parse_mlp_tile(const std::string& text) {
  if (text == "off") return 0;
  if (text == "auto") return kAutoMlpTile;
  int64_t tokens = 0;
  size_t used = 0;
  try {
    tokens = std::stoll(text, &used);
  } catch (const std::exception&) { used = 0; }
  MMSP_CHECK(used == text.size() && !text.empty() && tokens >= 1, "--tiled-mlp '", text,
             "' must be off, auto (tiles of at most the hidden size in tokens) or a number of tokens >= 1");
  return tokens;
}

std::string mlp_tile_name(int64_t setting) {
  if (setting == 0) return "off";
  if (setting == kAutoMlpTile) return "auto";
  return std::to_string(setting);
}

int64_t mlp_tile_tokens(int64_t setting, int64_t tokens, int64_t hidden) {
  MMSP_CHECK(setting >= kAutoMlpTile, "a tiled-MLP setting of ", setting, " is neither off, auto nor a tile");
  if (setting != kAutoMlpTile) return setting;
  const int64_t rows = std::max<int64_t>(tokens, 1), width = std::max<int64_t>(hidden, 1);
  const int64_t tiles = (rows + width - 1) / width;
  return (rows + tiles - 1) / tiles;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Tiled : torch::CustomClassHolder {
  Tiled(TokenwiseFn fn, std::vector<at::Tensor> weights, int64_t tile)
      : fn(std::move(fn)), weights(std::move(weights)), tile(tile) {}
  TokenwiseFn fn;
  std::vector<at::Tensor> weights;  // as the layer reads them (undefined: an absent bias)
  int64_t tile;
};

struct TiledOverTokens : torch::autograd::Function<TiledOverTokens> {
  // Inputs: x, then the weights that take a gradient (so that theirs take autograd's
  // usual path to .grad and the layer hooks see them complete).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList trainable,
                            const c10::intrusive_ptr<Tiled>& layer) {
    (void)trainable;
    ctx->save_for_backward({x});
    ctx->saved_data["layer"] = c10::IValue::make_capsule(layer);
    const int64_t T = x.size(0);
    if (T == 0) return layer->fn(x, layer->weights);  // a rank with no tokens: the layer's shapes, no rows
    at::Tensor out;
    for (int64_t start = 0; start < T; start += layer->tile) {
      const int64_t n = std::min(layer->tile, T - start);
      const at::Tensor y = layer->fn(x.narrow(0, start, n), layer->weights);  // grad off: nothing kept
      if (!out.defined()) {
        std::vector<int64_t> shape = y.sizes().vec();
        shape[0] = T;
        out = at::empty(shape, y.options());
      }
      out.narrow(0, start, n).copy_(y);
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto layer = c10::static_intrusive_pointer_cast<Tiled>(ctx->saved_data["layer"].toCapsule());
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& grad = grads[0];
    // Stand-ins for the weights that take a gradient: leaves whose .grad sums the tiles'
    // (autograd adds each tile's into it in place: one weight's gradient is the only
    // transient besides the tile's activations).
    std::vector<at::Tensor> stand_ins = layer->weights, leaves;
    for (at::Tensor& w : stand_ins)
      if (w.defined() && w.requires_grad()) leaves.push_back(w = w.detach().requires_grad_(true));
    const bool x_grad = ctx->needs_input_grad(0);
    at::Tensor dx = x_grad ? at::empty_like(x) : at::Tensor();
    const int64_t T = x.size(0);
    for (int64_t start = 0; start < T; start += layer->tile) {
      const int64_t n = std::min(layer->tile, T - start);
      at::Tensor tile = x.narrow(0, start, n).detach().requires_grad_(x_grad);
      at::Tensor y;
      {
        at::AutoGradMode with_grad(true);
        y = layer->fn(tile, stand_ins);
      }
      variable_list inputs = leaves;
      if (x_grad) inputs.push_back(tile);
      if (inputs.empty()) continue;
      torch::autograd::backward({y}, {grad.narrow(0, start, n)}, /*retain_graph=*/false, /*create_graph=*/false,
                                inputs);
      if (x_grad) dx.narrow(0, start, n).copy_(tile.grad());
    }
    variable_list out{dx};
    // No tokens (or a weight no tile read): zeros, as the untiled layer's product over no rows.
    for (const at::Tensor& leaf : leaves) out.push_back(leaf.grad().defined() ? leaf.grad() : at::zeros_like(leaf));
    out.emplace_back();  // the layer capsule
    return out;
  }
};

}  // namespace

at::Tensor tiled_over_tokens(TokenwiseFn fn, const at::Tensor& x, const std::vector<at::Tensor>& weights,
                             int64_t tile) {
  MMSP_CHECK(tile >= 1, "a tiled layer needs tiles of at least one token, not ", tile);
  MMSP_CHECK(x.dim() >= 1, "a tiled layer reads tokens along dim 0 of its input, which has no dims");
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& w : weights)
    if (w.defined() && w.requires_grad()) trainable.push_back(w);
  auto layer = c10::make_intrusive<Tiled>(std::move(fn), weights, tile);
  return TiledOverTokens::apply(x, at::TensorList(trainable), layer);
}

}  // namespace mmsp::model
