// LLaVA: CLIP tower, projector, Llama decoder; see llava.h. Follows Hugging Face's
// CLIPVisionTransformer (pre-layernorm, hidden_states[vision_feature_layer]) and
// LlavaMultiModalProjector.
#include "mmsp/model/families/llava/llava.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "mmsp/attention/local_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/model/families/llava/clip_config.h"
#include "mmsp/model/phase_marker.h"
#include "mmsp/model/activation.h"
#include "mmsp/model/parameter_init.h"

namespace mmsp::model {
ClipVisionTower::Layer::Layer(const ClipVisionConfig& c) {
  const double s = 0.02;
  layer_norm1 = register_module("layer_norm1", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps));
  layer_norm2 = register_module("layer_norm2", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps));
  auto attn = register_module("self_attn", std::make_shared<torch::nn::Module>());
  q_proj = attn->register_module("q_proj", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, s));
  k_proj = attn->register_module("k_proj", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, s));
  v_proj = attn->register_module("v_proj", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, s));
  out_proj = attn->register_module("out_proj", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, s));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", std::make_shared<Linear>(c.hidden_size, c.intermediate_size, true, s));
  fc2 = mlp->register_module("fc2", std::make_shared<Linear>(c.intermediate_size, c.hidden_size, true, s));
}

ClipVisionTower::ClipVisionTower(const ClipVisionConfig& c, const LlavaProjectorConfig& llava)
    : vision_(c), llava_(llava) {
  const int64_t positions = c.patches_per_side() * c.patches_per_side() + 1;
  auto model = register_module("vision_model", std::make_shared<torch::nn::Module>());
  auto embeddings = model->register_module("embeddings", std::make_shared<torch::nn::Module>());
  class_embedding = embeddings->register_parameter("class_embedding", normal_parameter({c.hidden_size}, 0.02));
  auto patch = embeddings->register_module("patch_embedding", std::make_shared<torch::nn::Module>());
  patch_weight = patch->register_parameter(
      "weight", normal_parameter({c.hidden_size, c.num_channels, c.patch_size, c.patch_size}, 0.02));
  auto position = embeddings->register_module("position_embedding", std::make_shared<torch::nn::Module>());
  position_weight = position->register_parameter("weight", normal_parameter({positions, c.hidden_size}, 0.02));
  pre_layrnorm_ = model->register_module("pre_layrnorm", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps));
  auto encoder = model->register_module("encoder", std::make_shared<torch::nn::Module>());
  auto layers = encoder->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_.push_back(layers->register_module(std::to_string(i), std::make_shared<Layer>(c)));
    hooked_layers_.add(layers_.back(), i < feature_layer());
  }
  // Present in the checkpoints; unused when the features come from an inner layer.
  post_layernorm_ = model->register_module("post_layernorm", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps));
}

int64_t ClipVisionTower::feature_layer() const {
  const int64_t L = vision_.num_hidden_layers;
  return llava_.vision_feature_layer < 0 ? L + 1 + llava_.vision_feature_layer : llava_.vision_feature_layer;
}

at::Tensor ClipVisionTower::forward(const at::Tensor& images) const {
  const ClipVisionConfig& c = vision_;
  MMSP_CHECK(images.dim() == 4 && images.size(1) == c.num_channels && images.size(2) == c.image_size &&
                 images.size(3) == c.image_size,
             "LLaVA images must be [N, ", c.num_channels, ", ", c.image_size, ", ", c.image_size,
             "], got ", images.sizes());
  const int64_t N = images.size(0), side = c.patches_per_side(), P = side * side, D = c.hidden_size;
  // Conv2d with stride = kernel: patches [N, P, C·p·p] @ weightᵀ, patches row-major.
  at::Tensor patches = images.reshape({N, c.num_channels, side, c.patch_size, side, c.patch_size})
                           .permute({0, 2, 4, 1, 3, 5})
                           .reshape({N, P, c.num_channels * c.patch_size * c.patch_size});
  at::Tensor x = at::linear(patches, patch_weight.reshape({D, -1}));               // [N, P, D]
  x = at::cat({class_embedding.expand({N, 1, D}), x}, 1) + position_weight;        // [N, P+1, D]
  x = leave_phase_in_backward(pre_layrnorm_->forward(x), Phase::vision);  // the tower's backward ends here
  // Each image is one bidirectional segment: the local kernel over all images at once.
  const attention::TokenLayout layout{at::arange(N, at::kLong).repeat_interleave(P + 1),
                                      at::arange(P + 1, at::kLong).repeat({N})};
  MMSP_CHECK(N > 0 || hooked_layers_.hooked(), "the CLIP tower needs at least one image");
  for (int64_t i = 0; i < feature_layer(); ++i) {
    // By value: a recomputed layer runs again after this frame (the tower outlives the step).
    std::shared_ptr<Layer> layer = layers_[i];
    x = hooked_layers_.run(
        i, [this, layer, layout](const at::Tensor& in) { return layer_forward(*layer, in, layout); }, x);
  }
  return llava_.vision_feature_select_strategy == "default" ? x.narrow(1, 1, P) : x;
}

at::Tensor ClipVisionTower::layer_forward(const Layer& l, const at::Tensor& x,
                                          const attention::TokenLayout& layout) const {
  const int64_t N = x.size(0), S = x.size(1), D = x.size(2), T = N * S;
  const int64_t heads = vision_.num_attention_heads, hd = D / heads;
  attention::AttentionOptions options;
  options.causal = false;
  at::Tensor h = l.layer_norm1->forward(x).reshape({T, D});
  at::Tensor q = l.q_proj->forward(h).view({T, heads, hd});
  at::Tensor k = l.k_proj->forward(h).view({T, heads, hd});
  at::Tensor v = l.v_proj->forward(h).view({T, heads, hd});
  at::Tensor a = attention::local_attention(q, k, v, layout, layout, options).reshape({N, S, D});
  at::Tensor y = x + l.out_proj->forward(a);
  return y + l.fc2->forward(activation(vision_.hidden_act, l.fc1->forward(l.layer_norm2->forward(y))));
}

LlavaTower::LlavaTower(const ClipVisionConfig& vision, const LlavaProjectorConfig& llava, int64_t text_hidden)
    : vision_(vision), llava_(llava), text_hidden_(text_hidden) {
  clip = std::make_shared<ClipVisionTower>(vision, llava);
  projector = std::make_shared<torch::nn::Module>();
  const bool bias = llava.multimodal_projector_bias;
  linear_1_ = projector->register_module("linear_1", std::make_shared<Linear>(vision.hidden_size, text_hidden, bias, 0.02));
  linear_2_ = projector->register_module("linear_2", std::make_shared<Linear>(text_hidden, text_hidden, bias, 0.02));
}

TowerInput LlavaTower::gather(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels) const {
  std::vector<int64_t> rows;
  for (const plan::VisionItem& item : items) {
    MMSP_CHECK(item.kind == plan::VisionKind::image, "LLaVA takes images only");
    rows.push_back(pixels.first_row(item, item.batch_index));
  }
  const int64_t last = *std::max_element(rows.begin(), rows.end());
  MMSP_CHECK(pixels.images.defined() && pixels.images.size(0) > last, "LLaVA needs pixel values at row ", last);
  return {pixels.images.index_select(0, at::tensor(at::ArrayRef<int64_t>(rows), at::kLong).clone()), {}};
}

TowerInput LlavaTower::no_items(const at::TensorOptions& options) const {
  return {at::zeros({0, vision_.num_channels, vision_.image_size, vision_.image_size}, options), {}};
}

at::Tensor LlavaTower::encode(const TowerInput& input) const {
  at::Tensor features = clip->forward(input.pixels);  // [n, rows, D]
  at::Tensor rows = linear_2_->forward(activation(llava_.projector_hidden_act, linear_1_->forward(features)));
  return rows.reshape({-1, text_hidden_});
}

std::shared_ptr<Vlm> build_llava(const ModelConfig& config) {
  MMSP_CHECK(clip_vision_of(config) && llava_projector_of(config), "model_type ", config.model_type,
             " is not LLaVA (no CLIP vision_config)");
  auto tower = std::make_shared<LlavaTower>(*clip_vision_of(config), *llava_projector_of(config), config.text.hidden_size);
  auto decoder = std::make_shared<Decoder>(config.text, config.tie_word_embeddings);
  auto vlm = std::make_shared<Vlm>(config, decoder, tower);
  vlm->register_module("vision_tower", tower->clip);
  vlm->register_module("multi_modal_projector", tower->projector);
  vlm->register_module("language_model", decoder);
  return vlm;
}

}  // namespace mmsp::model
