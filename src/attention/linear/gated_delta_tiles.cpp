// Gated DeltaNet over sequence tiles; see gated_delta_tiles.h.
#include "mmsp/attention/linear/gated_delta_tiles.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <utility>

#include "mmsp/core/check.h"

namespace mmsp::attention {

std::vector<SequenceTile> plan_sequence_tiles(const std::vector<TokenRun>& runs, int64_t tokens, int64_t tile,
                                              int64_t conv_kernel, int64_t chunk, const at::Device& device) {
  MMSP_CHECK(tile >= 1, "gated DeltaNet tiles need at least one row each, not ", tile);
  MMSP_CHECK(conv_kernel >= 1, "gated DeltaNet tiles: conv kernel must be >= 1, got ", conv_kernel);
  for (const TokenRun& run : runs)
    MMSP_CHECK(run.first_order == 0, "gated DeltaNet tiles: the run at row ", run.begin, " (segment ", run.segment,
               ") starts at order ", run.first_order,
               " of its segment; tiles need every run whole from its segment's start (no ring)");
  const int64_t halo = conv_kernel - 1;
  std::vector<SequenceTile> tiles;
  for (int64_t s = 0; s < tokens; s += tile) {
    SequenceTile t;
    t.begin = s;
    t.length = std::min(tile, tokens - s);
    t.context = std::min(halo, s);
    const int64_t a = s - t.context, e = s + t.length;
    // The rows the conv reads. A run that began before them is labelled as if its segment
    // started at their first row: the conv's taps of the tile's own rows then reach only
    // rows that are there (at most W − 1 back), and none reads a zero it should not.
    at::Tensor segment = at::full({e - a}, -1, at::kLong), order = at::zeros({e - a}, at::kLong);
    int64_t* seg = segment.data_ptr<int64_t>();
    int64_t* ord = order.data_ptr<int64_t>();
    std::vector<TokenRun> own;
    for (const TokenRun& run : runs) {
      const int64_t rb = run.begin, re = run.begin + run.length;
      const int64_t lo = std::max(rb, a), hi = std::min(re, e);
      if (lo >= hi) continue;
      for (int64_t row = lo; row < hi; ++row) {
        seg[row - a] = run.segment;
        ord[row - a] = rb >= a ? run.first_order + row - rb : row - a;
      }
      const int64_t tlo = std::max(rb, s);
      if (tlo < hi) own.push_back({tlo - s, hi - tlo, run.segment, run.first_order + tlo - rb});
      if (rb < s && re > s) t.continues = true;  // the tile's first run (runs are in row order)
      if (rb < e && re > e) t.carries = true;    // its last
    }
    t.conv = RingRunIndex::make({TokenLayout{segment, order}}, 0, conv_kernel, chunk, device);
    t.chunks = RunChunks::make(own, t.length, chunk, device);
    tiles.push_back(std::move(t));
  }
  return tiles;
}

int64_t sequence_tile_rows(int64_t setting, int64_t tokens, int64_t hidden, int64_t chunk) {
  MMSP_CHECK(setting >= 1 || setting == kAutoSequenceTile, "a sequence tile of ", setting,
             " rows is neither auto nor >= 1");
  MMSP_CHECK(chunk >= 1, "gated DeltaNet chunk must be >= 1, got ", chunk);
  if (setting != kAutoSequenceTile) return setting;
  const int64_t t = std::max<int64_t>(tokens, 1), width = std::max<int64_t>(hidden, 1);
  const int64_t tiles = (t + width - 1) / width;
  const int64_t rows = (t + tiles - 1) / tiles;
  return (rows + chunk - 1) / chunk * chunk;  // whole chunks: no tile border adds a partial one
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Tiles : torch::CustomClassHolder {
  Tiles(SequenceTileFn fn, std::vector<at::Tensor> weights, std::shared_ptr<const std::vector<SequenceTile>> tiles)
      : fn(std::move(fn)), weights(std::move(weights)), tiles(std::move(tiles)) {}
  SequenceTileFn fn;
  std::vector<at::Tensor> weights;
  std::shared_ptr<const std::vector<SequenceTile>> tiles;
  std::vector<at::Tensor> initial;  // [tile]: the state it starts its first run from (forward's)
};

at::Tensor rows_of(const at::Tensor& inputs, const SequenceTile& tile) {
  return inputs.narrow(0, tile.begin - tile.context, tile.context + tile.length);
}

struct SequenceTiled : torch::autograd::Function<SequenceTiled> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& inputs, at::TensorList trainable,
                            const c10::intrusive_ptr<Tiles>& t) {
    (void)trainable;
    ctx->save_for_backward({inputs});
    ctx->saved_data["tiles"] = c10::IValue::make_capsule(t);
    at::Tensor out, state;
    for (const SequenceTile& tile : *t->tiles) {  // grad off: a tile's intermediates go with it
      const at::Tensor initial = tile.continues ? state : at::Tensor();
      t->initial.push_back(initial);
      auto [o, final] = t->fn(rows_of(inputs, tile), t->weights, tile, initial);
      if (!out.defined()) {
        std::vector<int64_t> shape = o.sizes().vec();
        shape[0] = inputs.size(0);
        out = at::empty(shape, o.options());
      }
      out.narrow(0, tile.begin, tile.length).copy_(o);
      state = tile.carries ? final : at::Tensor();
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto t = c10::static_intrusive_pointer_cast<Tiles>(ctx->saved_data["tiles"].toCapsule());
    const at::Tensor inputs = ctx->get_saved_variables()[0];
    const at::Tensor& d_out = grads[0];
    // Stand-ins collect the weights' gradients over the tiles (as tiled_mlp.cpp does).
    std::vector<at::Tensor> stand_ins = t->weights, leaves;
    for (at::Tensor& w : stand_ins)
      if (w.defined() && w.requires_grad()) leaves.push_back(w = w.detach().requires_grad_(true));
    const bool x_grad = ctx->needs_input_grad(0);
    at::Tensor d_inputs = x_grad ? at::zeros_like(inputs) : at::Tensor();  // context rows add up
    at::Tensor d_state;  // the gradient of the state the tile being run hands on
    const std::vector<SequenceTile>& tiles = *t->tiles;
    for (size_t i = tiles.size(); i-- > 0;) {
      const SequenceTile& tile = tiles[i];
      at::Tensor rows = rows_of(inputs, tile).detach().requires_grad_(x_grad);
      at::Tensor initial = t->initial[i].defined() ? t->initial[i].detach().requires_grad_(true) : at::Tensor();
      std::pair<at::Tensor, at::Tensor> got;
      {
        at::AutoGradMode with_grad(true);
        got = t->fn(rows, stand_ins, tile, initial);
      }
      variable_list outputs{got.first}, output_grads{d_out.narrow(0, tile.begin, tile.length)};
      if (tile.carries && d_state.defined()) {
        outputs.push_back(got.second);
        output_grads.push_back(d_state);
      }
      variable_list wrt = leaves;
      if (x_grad) wrt.push_back(rows);
      if (initial.defined()) wrt.push_back(initial);
      d_state = at::Tensor();
      if (wrt.empty()) continue;
      torch::autograd::backward(outputs, output_grads, /*retain_graph=*/false, /*create_graph=*/false, wrt);
      if (x_grad && rows.grad().defined())
        d_inputs.narrow(0, tile.begin - tile.context, tile.context + tile.length).add_(rows.grad());
      if (initial.defined()) d_state = initial.grad();
    }
    variable_list out{d_inputs};
    for (const at::Tensor& leaf : leaves) out.push_back(leaf.grad().defined() ? leaf.grad() : at::zeros_like(leaf));
    out.emplace_back();  // the tiles capsule
    return out;
  }
};

}  // namespace

at::Tensor sequence_tiled(SequenceTileFn fn, const at::Tensor& inputs, const std::vector<at::Tensor>& weights,
                          std::shared_ptr<const std::vector<SequenceTile>> tiles) {
  MMSP_CHECK(tiles && !tiles->empty(), "sequence_tiled needs at least one tile");
  MMSP_CHECK(inputs.dim() >= 1 && tiles->back().begin + tiles->back().length == inputs.size(0),
             "sequence_tiled: the tiles cover ", tiles->back().begin + tiles->back().length, " rows, the inputs ",
             inputs.dim() >= 1 ? inputs.size(0) : 0);
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& w : weights)
    if (w.defined() && w.requires_grad()) trainable.push_back(w);
  auto t = c10::make_intrusive<Tiles>(std::move(fn), weights, std::move(tiles));
  return SequenceTiled::apply(inputs, at::TensorList(trainable), t);
}

}  // namespace mmsp::attention
