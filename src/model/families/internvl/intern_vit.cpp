// InternViT; see intern_vit.h. Follows transformers' InternVLVisionEmbeddings,
// InternVLVisionLayer and InternVLVisionAttention (no dropout: training runs are exact).
#include "mmsp/model/families/internvl/intern_vit.h"

#include <ATen/ATen.h>

#include "mmsp/attention/local_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/model/families/internvl/internvl_config.h"
#include "mmsp/model/layers/activation.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/model/phase_marker.h"

namespace mmsp::model {

InternVisionTower::Norm::Norm(torch::nn::Module& parent, const std::string& name, const InternVisionConfig& c) {
  if (c.norm_type == "rms_norm")
    rms_norm = parent.register_module(name, std::make_shared<RMSNorm>(c.hidden_size, c.layer_norm_eps));
  else
    layer_norm = parent.register_module(name, std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps));
}

at::Tensor InternVisionTower::Norm::operator()(const at::Tensor& x) const {
  return rms_norm ? rms_norm->forward(x) : layer_norm->forward(x);
}

InternVisionTower::Layer::Layer(const InternVisionConfig& c) {
  const int64_t D = c.hidden_size;
  const double s = c.initializer_range;
  layernorm_before.emplace(*this, "layernorm_before", c);
  auto attention = register_module("attention", std::make_shared<torch::nn::Module>());
  q_proj = attention->register_module("q_proj", std::make_shared<Linear>(D, D, c.attention_bias, s));
  k_proj = attention->register_module("k_proj", std::make_shared<Linear>(D, D, c.attention_bias, s));
  v_proj = attention->register_module("v_proj", std::make_shared<Linear>(D, D, c.attention_bias, s));
  projection_layer = attention->register_module("projection_layer", std::make_shared<Linear>(D, D, true, s));
  if (c.use_qk_norm) {  // transformers' InternVLVisionRMSNorm(embed_dim): eps 1e-6 whatever layer_norm_eps says
    q_norm = attention->register_module("q_norm", std::make_shared<RMSNorm>(D, 1e-6));
    k_norm = attention->register_module("k_norm", std::make_shared<RMSNorm>(D, 1e-6));
  }
  lambda_1 = register_parameter(
      "lambda_1", new_parameter({D}, [&](at::IntArrayRef shape) { return at::full(shape, c.layer_scale_init_value); }));
  layernorm_after.emplace(*this, "layernorm_after", c);
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", std::make_shared<Linear>(D, c.intermediate_size, true, s));
  fc2 = mlp->register_module("fc2", std::make_shared<Linear>(c.intermediate_size, D, true, s));
  lambda_2 = register_parameter(
      "lambda_2", new_parameter({D}, [&](at::IntArrayRef shape) { return at::full(shape, c.layer_scale_init_value); }));
}

InternVisionTower::InternVisionTower(const InternVisionConfig& c) : config_(c) {
  const int64_t D = c.hidden_size, P = c.patches_per_side() * c.patches_per_side();
  auto embeddings = register_module("embeddings", std::make_shared<torch::nn::Module>());
  // transformers zero-initialises the class token and the position table; a random draw
  // (the released weights replace both) lets a test from scratch see every gradient.
  cls_token = embeddings->register_parameter("cls_token", normal_parameter({1, 1, D}, c.initializer_range));
  auto patch = embeddings->register_module("patch_embeddings", std::make_shared<torch::nn::Module>());
  auto projection = patch->register_module("projection", std::make_shared<torch::nn::Module>());
  patch_weight = projection->register_parameter(
      "weight", normal_parameter({D, c.num_channels, c.patch_size, c.patch_size}, c.initializer_range));
  patch_bias = projection->register_parameter("bias", zeros_parameter({D}));
  position_embeddings =
      embeddings->register_parameter("position_embeddings", normal_parameter({1, P + 1, D}, c.initializer_range));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto layer = encoder->register_module("layer", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_.push_back(layer->register_module(std::to_string(i), std::make_shared<Layer>(c)));
    hooked_layers_.add(layers_.back());
  }
  if (!c.use_mean_pooling) layernorm_ = register_module("layernorm", std::make_shared<LayerNorm>(D, c.layer_norm_eps));
}

at::Tensor InternVisionTower::forward(const at::Tensor& tiles) const {
  const InternVisionConfig& c = config_;
  MMSP_CHECK(tiles.dim() == 4 && tiles.size(1) == c.num_channels && tiles.size(2) == c.image_size &&
                 tiles.size(3) == c.image_size,
             "InternVL tiles must be [N, ", c.num_channels, ", ", c.image_size, ", ", c.image_size, "], got ",
             tiles.sizes());
  const int64_t N = tiles.size(0), side = c.patches_per_side(), P = side * side, D = c.hidden_size;
  // Conv2d with stride = kernel: patches [N, P, C·p·p] (row-major) @ weightᵀ + bias.
  at::Tensor patches = tiles.reshape({N, c.num_channels, side, c.patch_size, side, c.patch_size})
                           .permute({0, 2, 4, 1, 3, 5})
                           .reshape({N, P, c.num_channels * c.patch_size * c.patch_size});
  at::Tensor x = at::linear(patches, patch_weight.reshape({D, -1}), patch_bias);  // [N, P, D]
  x = at::cat({cls_token.expand({N, 1, D}), x}, 1) + position_embeddings;         // [N, P+1, D]
  x = leave_phase_in_backward(x, Phase::vision);                                  // the tower's backward ends here
  const attention::TokenLayout layout{at::arange(N, at::kLong).repeat_interleave(P + 1),
                                      at::arange(P + 1, at::kLong).repeat({N})};
  for (size_t i = 0; i < layers_.size(); ++i) {
    // By value: a recomputed layer runs again after this frame (the tower outlives the step).
    std::shared_ptr<Layer> layer = layers_[i];
    x = hooked_layers_.run(
        i, [this, layer, layout](const at::Tensor& in) { return layer_forward(*layer, in, layout); }, x);
  }
  if (layernorm_) x = layernorm_->forward(x);
  return x.narrow(1, 1, P);  // "default": the class token dropped
}

at::Tensor InternVisionTower::layer_forward(const Layer& l, const at::Tensor& x,
                                            const attention::TokenLayout& layout) const {
  const int64_t N = x.size(0), S = x.size(1), D = x.size(2), T = N * S;
  const int64_t heads = config_.num_attention_heads, hd = D / heads;
  attention::AttentionOptions options;
  options.causal = false;
  at::Tensor h = (*l.layernorm_before)(x).reshape({T, D});
  at::Tensor q = l.q_proj->forward(h), k = l.k_proj->forward(h);
  if (l.q_norm) {  // over the whole width, before the heads split
    q = l.q_norm->forward(q);
    k = l.k_norm->forward(k);
  }
  at::Tensor a = attention::local_attention(q.view({T, heads, hd}), k.view({T, heads, hd}),
                                            l.v_proj->forward(h).view({T, heads, hd}), layout, layout, options);
  at::Tensor y = x + l.lambda_1 * l.projection_layer->forward(a.reshape({N, S, D}));
  at::Tensor m = l.fc2->forward(activation(config_.hidden_act, l.fc1->forward((*l.layernorm_after)(y))));
  return y + l.lambda_2 * m;
}

}  // namespace mmsp::model
