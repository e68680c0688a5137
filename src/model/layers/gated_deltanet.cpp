// The Gated DeltaNet module; see gated_deltanet.h.
#include "mmsp/model/layers/gated_deltanet.h"

#include <ATen/ATen.h>

#include <cmath>

#include "mmsp/model/layers/parameter_init.h"

namespace mmsp::model {

GatedDeltaNetConfig gated_deltanet_config(const TextConfig& t, int64_t chunk) {
  GatedDeltaNetConfig c;
  c.hidden_size = t.hidden_size;
  c.num_key_heads = t.linear_num_key_heads;
  c.num_value_heads = t.linear_num_value_heads;
  c.key_head_dim = t.linear_key_head_dim;
  c.value_head_dim = t.linear_value_head_dim;
  c.conv_kernel = t.linear_conv_kernel_dim;
  c.rms_norm_eps = t.rms_norm_eps;
  c.chunk = chunk;
  return c;
}

GatedDeltaNet::GatedDeltaNet(const TextConfig& t) : config_(t) {
  const GatedDeltaNetConfig c = gated_deltanet_config(t);
  c.check();
  const double s = t.initializer_range;
  const int64_t hidden = t.hidden_size, Hv = c.num_value_heads;
  auto linear = [&](const char* name, int64_t out, int64_t in) {
    return register_module(name, std::make_shared<Linear>(in, out, false, s));
  };
  if (t.linear_split_projections) {
    in_proj_qkv_ = linear("in_proj_qkv", c.conv_dim(), hidden);
    in_proj_z_ = linear("in_proj_z", c.value_dim(), hidden);
    in_proj_b_ = linear("in_proj_b", Hv, hidden);
    in_proj_a_ = linear("in_proj_a", Hv, hidden);
  } else {
    in_proj_qkvz_ = linear("in_proj_qkvz", c.conv_dim() + c.value_dim(), hidden);
    in_proj_ba_ = linear("in_proj_ba", 2 * Hv, hidden);
  }
  // nn.Conv1d's default: uniform in ±1/sqrt(fan_in), fan_in = kernel (depthwise).
  const double bound = 1.0 / std::sqrt(static_cast<double>(c.conv_kernel));
  auto conv1d = register_module("conv1d", std::make_shared<torch::nn::Module>());
  conv1d_weight_ = conv1d->register_parameter(
      "weight", new_parameter({c.conv_dim(), 1, c.conv_kernel},
                              [bound](at::IntArrayRef s) { return at::rand(s) * (2 * bound) - bound; }));
  // As transformers initialises them: dt_bias 1, A = exp(A_log) uniform in [0.01, 16].
  dt_bias_ = register_parameter("dt_bias", ones_parameter({Hv}));
  A_log_ = register_parameter(
      "A_log", new_parameter({Hv}, [](at::IntArrayRef s) { return (at::rand(s) * (16 - 0.01) + 0.01).log(); }));
  auto norm = register_module("norm", std::make_shared<torch::nn::Module>());
  norm_weight_ = norm->register_parameter("weight", ones_parameter({c.value_head_dim}));
  out_proj_ = linear("out_proj", hidden, c.value_dim());
}

GatedDeltaNetWeights GatedDeltaNet::weights() const {
  GatedDeltaNetWeights w;
  if (config_.linear_split_projections) {
    const int64_t Hk = config_.linear_num_key_heads, K = config_.linear_key_head_dim;
    const int64_t n = config_.linear_num_value_heads / Hk, V = config_.linear_value_head_dim;
    const int64_t hidden = config_.hidden_size;
    const at::Tensor qkv = in_proj_qkv_->effective_weight();  // [q (H_k·K) | k (H_k·K) | v (H_v·V)] rows
    at::Tensor q = qkv.narrow(0, 0, Hk * K).view({Hk, K, hidden});
    at::Tensor k = qkv.narrow(0, Hk * K, Hk * K).view({Hk, K, hidden});
    at::Tensor v = qkv.narrow(0, 2 * Hk * K, Hk * n * V).view({Hk, n * V, hidden});
    at::Tensor z = in_proj_z_->effective_weight().view({Hk, n * V, hidden});
    w.in_proj_qkvz = at::cat({q, k, v, z}, 1).reshape({-1, hidden});
    w.in_proj_ba = at::cat({in_proj_b_->effective_weight().view({Hk, n, hidden}),
                            in_proj_a_->effective_weight().view({Hk, n, hidden})},
                           1)
                       .reshape({-1, hidden});
  } else {
    w.in_proj_qkvz = in_proj_qkvz_->effective_weight();
    w.in_proj_ba = in_proj_ba_->effective_weight();
  }
  w.conv1d_weight = conv1d_weight_;
  w.A_log = A_log_;
  w.dt_bias = dt_bias_;
  w.norm_weight = norm_weight_;
  w.out_proj = out_proj_->effective_weight();  // LoRA adapters merged in (lora.h)
  return w;
}

at::Tensor GatedDeltaNet::forward(const at::Tensor& x, const attention::GatedDeltaContext& context, int64_t chunk,
                                  int64_t tile) const {
  GatedDeltaNetConfig c = gated_deltanet_config(config_, chunk);
  c.tile = tile;
  return gated_deltanet_forward(weights(), c, x, context);
}

}  // namespace mmsp::model
