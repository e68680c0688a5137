// The Gated DeltaNet layer; see gated_deltanet_layer.h. The algorithm (conv, gates,
// norm) is written once; attention/gated_delta_context places it on the mesh (which heads
// a rank holds, which tokens) and gated_delta_ring supplies what lives on other ring ranks.
#include "mmsp/model/layers/gated_deltanet_layer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "mmsp/attention/linear/gated_delta_tiles.h"
#include "mmsp/core/check.h"
#include "mmsp/model/layers/tiled_mlp.h"

namespace mmsp::model {

void GatedDeltaNetConfig::check() const {
  MMSP_CHECK(num_key_heads > 0 && num_value_heads % num_key_heads == 0, "linear_num_value_heads (", num_value_heads,
             ") must be a multiple of linear_num_key_heads (", num_key_heads, ")");
  MMSP_CHECK(chunk > 0, "gated DeltaNet chunk must be positive, got ", chunk);
  MMSP_CHECK(key_head_dim > 0 && value_head_dim > 0 && hidden_size > 0 && conv_kernel > 0,
             "gated DeltaNet sizes must be positive: hidden ", hidden_size, ", K ", key_head_dim, ", V ",
             value_head_dim, ", conv kernel ", conv_kernel);
  MMSP_CHECK(tile >= -1, "gated DeltaNet tile ", tile, " is neither 0 (whole), -1 (auto) nor a number of rows");
}

GatedDeltaNetWeights GatedDeltaNetWeights::random(const GatedDeltaNetConfig& c, const at::TensorOptions& options,
                                                  uint64_t seed) {
  c.check();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto randn = [&](at::IntArrayRef shape, double scale) { return (at::randn(shape, gen, f64) * scale).to(options); };
  GatedDeltaNetWeights w;
  const double in_scale = 1.0 / std::sqrt(static_cast<double>(c.hidden_size));
  w.in_proj_qkvz = randn({2 * c.key_dim() + 2 * c.value_dim(), c.hidden_size}, in_scale);
  w.in_proj_ba = randn({2 * c.num_value_heads, c.hidden_size}, in_scale);
  w.conv1d_weight = randn({c.conv_dim(), 1, c.conv_kernel}, 0.5);
  w.A_log = (at::rand({c.num_value_heads}, gen, f64) * 15 + 1).log().to(options);
  w.dt_bias = randn({c.num_value_heads}, 0.5);
  w.norm_weight = randn({c.value_head_dim}, 0.1) + 1;
  w.out_proj = randn({c.hidden_size, c.value_dim()}, 1.0 / std::sqrt(static_cast<double>(c.value_dim())));
  return w;
}

std::vector<std::pair<std::string, at::Tensor>> GatedDeltaNetWeights::named() const {
  return {{"in_proj_qkvz.weight", in_proj_qkvz},
          {"in_proj_ba.weight", in_proj_ba},
          {"conv1d.weight", conv1d_weight},
          {"A_log", A_log},
          {"dt_bias", dt_bias},
          {"norm.weight", norm_weight},
          {"out_proj.weight", out_proj}};
}

void GatedDeltaNetWeights::check(const GatedDeltaNetConfig& c) const {
  auto expect = [](const at::Tensor& t, std::vector<int64_t> shape, const char* name) {
    MMSP_CHECK(t.defined() && t.sizes() == at::IntArrayRef(shape), "gated DeltaNet weight ", name, " must have shape ",
               at::IntArrayRef(shape), ", got ", t.defined() ? t.sizes() : at::IntArrayRef());
  };
  expect(in_proj_qkvz, {2 * c.key_dim() + 2 * c.value_dim(), c.hidden_size}, "in_proj_qkvz.weight");
  expect(in_proj_ba, {2 * c.num_value_heads, c.hidden_size}, "in_proj_ba.weight");
  expect(conv1d_weight, {c.conv_dim(), 1, c.conv_kernel}, "conv1d.weight");
  expect(A_log, {c.num_value_heads}, "A_log");
  expect(dt_bias, {c.num_value_heads}, "dt_bias");
  expect(norm_weight, {c.value_head_dim}, "norm.weight");
  expect(out_proj, {c.hidden_size, c.value_dim()}, "out_proj.weight");
}

int64_t gated_delta_ulysses_bytes(const GatedDeltaNetConfig& c, int64_t local_tokens, int ulysses,
                                  int64_t element_size) {
  const int64_t in = 2 * c.key_dim() + c.value_dim() + 2 * c.num_value_heads;
  return (ulysses - 1) * local_tokens * (in + c.value_dim()) * element_size / ulysses;
}

int64_t gated_delta_ulysses_bytes(const GatedDeltaNetConfig& c, const std::vector<int64_t>& tokens, int rank,
                                  int64_t element_size) {
  const int64_t U = static_cast<int64_t>(tokens.size());
  const int64_t in = 2 * c.key_dim() + c.value_dim() + 2 * c.num_value_heads;
  int64_t others = 0;
  for (int64_t p = 0; p < U; ++p)
    if (p != rank) others += tokens[p];
  return ((U - 1) * tokens[rank] * in + others * c.value_dim()) * element_size / U;
}

namespace {

at::Tensor l2norm(const at::Tensor& x) { return x * at::rsqrt(x.pow(2).sum(-1, true) + 1e-6); }

}  // namespace

namespace {

// The rule's inputs of key heads [first, first + heads) and their value heads, from mixed
// [T, heads, F] (per key head q K | k K | v rep·V | b rep | a rep) on rows in `conv`'s
// layout: the conv over every row, then only rows [skip, T) (a tile's own) go on.
struct RuleInputs {
  at::Tensor q, k, v, g, beta;
};
RuleInputs rule_inputs(const at::Tensor& conv1d_weight, const at::Tensor& A_log, const at::Tensor& dt_bias,
                       const GatedDeltaNetConfig& c, const at::Tensor& mixed, int64_t first, int64_t heads,
                       const attention::GatedDeltaRun& conv, int64_t skip, at::ScalarType wide) {
  const int64_t K = c.key_head_dim, V = c.value_head_dim, rep = c.num_value_heads / c.num_key_heads;
  const int64_t T = mixed.size(0), Hv = heads * rep, n = T - skip;
  at::Tensor q = mixed.narrow(-1, 0, K), k = mixed.narrow(-1, K, K);
  at::Tensor v = mixed.narrow(-1, 2 * K, rep * V).reshape({T, Hv, V});
  at::Tensor b = mixed.narrow(0, skip, n).narrow(-1, 2 * K + rep * V, rep).reshape({n, Hv});
  at::Tensor a = mixed.narrow(0, skip, n).narrow(-1, 2 * K + rep * V + rep, rep).reshape({n, Hv});

  // These heads' channels of the conv: their q and k, their value heads' v.
  at::Tensor conv_w = conv1d_weight.squeeze(1);  // [conv_dim, W]
  at::Tensor w_heads =
      at::cat({conv_w.narrow(0, first * K, heads * K), conv_w.narrow(0, c.key_dim() + first * K, heads * K),
               conv_w.narrow(0, 2 * c.key_dim() + first * rep * V, Hv * V)});
  at::Tensor qkv = at::cat({q.reshape({T, -1}), k.reshape({T, -1}), v.reshape({T, -1})}, -1);
  qkv = attention::gated_delta_conv(qkv, w_heads, conv).narrow(0, skip, n);  // [n, channels]
  RuleInputs in;
  in.q = l2norm(qkv.narrow(-1, 0, heads * K).view({n, heads, K})).repeat_interleave(rep, 1);
  in.k = l2norm(qkv.narrow(-1, heads * K, heads * K).view({n, heads, K})).repeat_interleave(rep, 1);
  in.v = qkv.narrow(-1, 2 * heads * K, Hv * V).view({n, Hv, V});
  in.beta = at::sigmoid(b);
  in.g = -A_log.narrow(0, first * rep, Hv).to(wide).exp() *
         at::softplus(a.to(wide) + dt_bias.narrow(0, first * rep, Hv).to(wide));
  return in;
}

// The conv and the gated delta rule of key heads [first, first + heads) on tokens in
// run.index's layout: mixed [T, heads, F] -> o [T, heads·rep, V]. With c.tile set and
// the share whole (no ring), over sequence tiles (attention/gated_delta_tiles.h).
at::Tensor rule_of_heads(const GatedDeltaNetWeights& w, const GatedDeltaNetConfig& c, const at::Tensor& mixed,
                         int64_t first, int64_t heads, const attention::GatedDeltaRun& run, at::ScalarType wide) {
  const int64_t T = mixed.size(0);
  const bool whole_share = run.index.runs.runs.size() == 1;
  const int64_t rows = c.tile != 0 ? attention::sequence_tile_rows(c.tile, T, c.hidden_size, c.chunk) : 0;
  if (rows > 0 && whole_share && T > rows) {
    auto tiles = std::make_shared<const std::vector<attention::SequenceTile>>(
        attention::plan_sequence_tiles(run.index.runs.runs[0], T, rows, c.conv_kernel, c.chunk, mixed.device()));
    auto tile_rule = [c, first, heads, wide](const at::Tensor& m, const std::vector<at::Tensor>& ws,
                                             const attention::SequenceTile& tile, const at::Tensor& initial) {
      RuleInputs in =
          rule_inputs(ws[0], ws[1], ws[2], c, m, first, heads, attention::local_run(tile.conv), tile.context, wide);
      const int64_t runs = tile.chunks.runs;
      at::Tensor init;  // [runs, H, K, V]: the first run's from the tile before, the others' zero
      if (initial.defined()) {
        std::vector<int64_t> rest = initial.sizes().vec();
        rest.insert(rest.begin(), runs - 1);
        init = at::cat({initial.unsqueeze(0), at::zeros(rest, initial.options())});
      }
      attention::GatedDeltaResult r =
          attention::gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, tile.chunks, init, /*transitions=*/false);
      return std::make_pair(r.out, tile.carries ? r.final[runs - 1] : at::Tensor());
    };
    return attention::sequence_tiled(tile_rule, mixed, {w.conv1d_weight, w.A_log, w.dt_bias}, tiles);
  }
  RuleInputs in = rule_inputs(w.conv1d_weight, w.A_log, w.dt_bias, c, mixed, first, heads, run, 0, wide);
  return attention::gated_delta_ring_rule(in.q, in.k, in.v, in.g, in.beta, run);  // [T, Hv, V]
}

// The gated RMSNorm per value head, then the output projection: o, z [T, Hv, V] ->
// [T, hidden]. Token-wise: it runs over tiles too.
at::Tensor gated_norm_out(const at::Tensor& o, const at::Tensor& z, const at::Tensor& norm_weight,
                          const at::Tensor& out_proj, double eps, at::ScalarType wide) {
  at::Tensor ow = o.to(wide);
  at::Tensor normed = (ow * at::rsqrt(ow.pow(2).mean(-1, true) + eps)).to(o.scalar_type());
  normed = (norm_weight * normed).to(wide) * at::silu(z.to(wide));
  return at::matmul(normed.to(o.scalar_type()).reshape({o.size(0), -1}), out_proj.t());
}

}  // namespace

at::Tensor gated_deltanet_forward(const GatedDeltaNetWeights& w, const GatedDeltaNetConfig& c, const at::Tensor& x,
                                  const attention::GatedDeltaContext& context) {
  // Every check before the first collective (the context's in gated_delta_context_rule).
  c.check();
  w.check(c);
  MMSP_CHECK(x.dim() == 2 && x.size(1) == c.hidden_size, "gated DeltaNet: x must be [T, ", c.hidden_size, "], got ",
             x.sizes());
  const int64_t T_l = x.size(0);
  const int64_t Hk = c.num_key_heads, Hv = c.num_value_heads, K = c.key_head_dim, V = c.value_head_dim;
  const int64_t rep = Hv / Hk;
  // Per key head: [q K | k K | v rep·V | z rep·V] and [b rep | a rep]. What travels,
  // mixed [T_l, Hk, F] (F = 2K + rep·V + 2·rep), and the gate z come from their own rows
  // of the weights: no [T_l, Hk, 2K + 2·rep·V] product is made, cut and copied, nor in
  // the backward the zero-filled gradients of its two cuts.
  const int64_t F = 2 * K + rep * V + 2 * rep;
  const at::Tensor w_qkvz = w.in_proj_qkvz.view({Hk, 2 * K + 2 * rep * V, c.hidden_size});
  const at::Tensor w_mixed =
      at::cat({w_qkvz.narrow(1, 0, 2 * K + rep * V), w.in_proj_ba.view({Hk, 2 * rep, c.hidden_size})}, 1)
          .view({Hk * F, c.hidden_size});
  const at::Tensor w_z = w_qkvz.narrow(1, 2 * K + rep * V, rep * V).reshape({Hv * V, c.hidden_size});
  at::Tensor mixed = at::matmul(x, w_mixed.t()).view({T_l, Hk, F});
  at::Tensor z = at::matmul(x, w_z.t()).view({T_l, Hv, V});
  // As in HF: the decay and the norm in fp32 for 16-bit inputs.
  const at::ScalarType wide = c10::elementSize(x.scalar_type()) < 4 ? at::kFloat : x.scalar_type();

  const attention::GatedDeltaHeads heads{Hk, Hv, V, c.conv_kernel, c.chunk};
  at::Tensor o = attention::gated_delta_context_rule(
      mixed, heads, context, [&](const at::Tensor& m, int64_t first, int64_t n, const attention::GatedDeltaRun& run) {
        return rule_of_heads(w, c, m, first, n, run, wide);
      });

  const double eps = c.rms_norm_eps;
  const int64_t tile = c.tile != 0 ? mlp_tile_tokens(c.tile, T_l, c.hidden_size) : 0;
  if (tile > 0 && T_l > tile) {  // the norm's fp32 tensors a tile at a time; o and z kept as one
    auto norm_out = [eps, wide, V](const at::Tensor& oz, const std::vector<at::Tensor>& ws) {
      return gated_norm_out(oz.narrow(-1, 0, V), oz.narrow(-1, V, V), ws[0], ws[1], eps, wide);
    };
    return tiled_over_tokens(norm_out, at::cat({o, z}, -1), {w.norm_weight, w.out_proj}, tile);
  }
  return gated_norm_out(o, z, w.norm_weight, w.out_proj, eps, wide);
}

}  // namespace mmsp::model
