// The Gated DeltaNet layer; see gated_deltanet_layer.h. The algorithm (conv, gates,
// norm) is written once; attention/gated_delta_context places it on the mesh (which heads
// a rank holds, which tokens) and gated_delta_ring supplies what lives on other ring ranks.
#include "mmsp/model/layers/gated_deltanet_layer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>


#include "mmsp/core/check.h"

namespace mmsp::model {

void GatedDeltaNetConfig::check() const {
  MMSP_CHECK(num_key_heads > 0 && num_value_heads % num_key_heads == 0,
             "linear_num_value_heads (", num_value_heads, ") must be a multiple of linear_num_key_heads (",
             num_key_heads, ")");
  MMSP_CHECK(chunk > 0, "gated DeltaNet chunk must be positive, got ", chunk);
  MMSP_CHECK(key_head_dim > 0 && value_head_dim > 0 && hidden_size > 0 && conv_kernel > 0,
             "gated DeltaNet sizes must be positive: hidden ", hidden_size, ", K ", key_head_dim, ", V ",
             value_head_dim, ", conv kernel ", conv_kernel);
}

GatedDeltaNetWeights GatedDeltaNetWeights::random(const GatedDeltaNetConfig& c, const at::TensorOptions& options,
                                                  uint64_t seed) {
  c.check();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto randn = [&](at::IntArrayRef shape, double scale) {
    return (at::randn(shape, gen, f64) * scale).to(options);
  };
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
  return {{"in_proj_qkvz.weight", in_proj_qkvz}, {"in_proj_ba.weight", in_proj_ba},
          {"conv1d.weight", conv1d_weight},      {"A_log", A_log},
          {"dt_bias", dt_bias},                  {"norm.weight", norm_weight},
          {"out_proj.weight", out_proj}};
}

void GatedDeltaNetWeights::check(const GatedDeltaNetConfig& c) const {
  auto expect = [](const at::Tensor& t, std::vector<int64_t> shape, const char* name) {
    MMSP_CHECK(t.defined() && t.sizes() == at::IntArrayRef(shape), "gated DeltaNet weight ", name,
               " must have shape ", at::IntArrayRef(shape), ", got ",
               t.defined() ? t.sizes() : at::IntArrayRef());
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

// The conv and the gated delta rule of key heads [first, first + heads) and their value
// heads, on tokens in `index`'s layout: mixed [T, heads, F] (per key head q K | k K | v
// rep·V | b rep | a rep) -> o [T, heads·rep, V].
at::Tensor rule_of_heads(const GatedDeltaNetWeights& w, const GatedDeltaNetConfig& c, const at::Tensor& mixed,
                         int64_t first, int64_t heads, const attention::GatedDeltaRun& run, at::ScalarType wide) {
  const int64_t K = c.key_head_dim, V = c.value_head_dim, rep = c.num_value_heads / c.num_key_heads;
  const int64_t T = mixed.size(0), Hv = heads * rep;
  at::Tensor q = mixed.narrow(-1, 0, K), k = mixed.narrow(-1, K, K);
  at::Tensor v = mixed.narrow(-1, 2 * K, rep * V).reshape({T, Hv, V});
  at::Tensor b = mixed.narrow(-1, 2 * K + rep * V, rep).reshape({T, Hv});
  at::Tensor a = mixed.narrow(-1, 2 * K + rep * V + rep, rep).reshape({T, Hv});

  // These heads' channels of the conv: their q and k, their value heads' v.
  at::Tensor conv_w = w.conv1d_weight.squeeze(1);  // [conv_dim, W]
  at::Tensor w_heads = at::cat({conv_w.narrow(0, first * K, heads * K),
                                conv_w.narrow(0, c.key_dim() + first * K, heads * K),
                                conv_w.narrow(0, 2 * c.key_dim() + first * rep * V, Hv * V)});
  at::Tensor qkv = at::cat({q.reshape({T, -1}), k.reshape({T, -1}), v.reshape({T, -1})}, -1);
  qkv = attention::gated_delta_conv(qkv, w_heads, run);  // [T, channels of these heads]
  q = l2norm(qkv.narrow(-1, 0, heads * K).view({T, heads, K})).repeat_interleave(rep, 1);
  k = l2norm(qkv.narrow(-1, heads * K, heads * K).view({T, heads, K})).repeat_interleave(rep, 1);
  v = qkv.narrow(-1, 2 * heads * K, Hv * V).view({T, Hv, V});

  at::Tensor beta = at::sigmoid(b);
  at::Tensor g = -w.A_log.narrow(0, first * rep, Hv).to(wide).exp() *
                 at::softplus(a.to(wide) + w.dt_bias.narrow(0, first * rep, Hv).to(wide));
  return attention::gated_delta_ring_rule(q, k, v, g, beta, run);  // [T, Hv, V]
}

}  // namespace

at::Tensor gated_deltanet_forward(const GatedDeltaNetWeights& w, const GatedDeltaNetConfig& c,
                                  const at::Tensor& x, const attention::GatedDeltaContext& context) {
  // Every check before the first collective (the context's in gated_delta_context_rule).
  c.check();
  w.check(c);
  MMSP_CHECK(x.dim() == 2 && x.size(1) == c.hidden_size, "gated DeltaNet: x must be [T, ", c.hidden_size,
             "], got ", x.sizes());
  const int64_t T_l = x.size(0);
  const int64_t Hk = c.num_key_heads, Hv = c.num_value_heads, K = c.key_head_dim, V = c.value_head_dim;
  const int64_t rep = Hv / Hk;
  // Per key head: [q K | k K | v rep·V | z rep·V] and [b rep | a rep].
  at::Tensor qkvz = at::matmul(x, w.in_proj_qkvz.t()).view({T_l, Hk, 2 * K + 2 * rep * V});
  at::Tensor ba = at::matmul(x, w.in_proj_ba.t()).view({T_l, Hk, 2 * rep});
  at::Tensor z = qkvz.narrow(-1, 2 * K + rep * V, rep * V).reshape({T_l, Hv, V});
  // [T_l, Hk, F]: what travels, F = 2K + rep·V + 2·rep
  at::Tensor mixed = at::cat({qkvz.narrow(-1, 0, 2 * K + rep * V), ba}, -1);
  // As in HF: the decay and the norm in fp32 for 16-bit inputs.
  const at::ScalarType wide = c10::elementSize(x.scalar_type()) < 4 ? at::kFloat : x.scalar_type();

  const attention::GatedDeltaHeads heads{Hk, Hv, V, c.conv_kernel, c.chunk};
  at::Tensor o = attention::gated_delta_context_rule(
      mixed, heads, context,
      [&](const at::Tensor& m, int64_t first, int64_t n, const attention::GatedDeltaRun& run) {
        return rule_of_heads(w, c, m, first, n, run, wide);
      });

  // Gated RMSNorm per value head, then the output projection.
  at::Tensor ow = o.to(wide);
  at::Tensor normed = (ow * at::rsqrt(ow.pow(2).mean(-1, true) + c.rms_norm_eps)).to(x.scalar_type());
  normed = (w.norm_weight * normed).to(wide) * at::silu(z.to(wide));
  return at::matmul(normed.to(x.scalar_type()).reshape({T_l, Hv * V}), w.out_proj.t());
}

}  // namespace mmsp::model
