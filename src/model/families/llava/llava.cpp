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
#include "mmsp/model/layers/activation.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/model/phase_marker.h"

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
  post_layernorm_ =
      model->register_module("post_layernorm", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps));
}

int64_t ClipVisionTower::feature_layer() const {
  const int64_t L = vision_.num_hidden_layers;
  return llava_.vision_feature_layer < 0 ? L + 1 + llava_.vision_feature_layer : llava_.vision_feature_layer;
}

at::Tensor ClipVisionTower::forward(const at::Tensor& images) const {
  const int64_t P = vision_.patches_per_side() * vision_.patches_per_side();
  const int64_t rows = llava_.vision_feature_select_strategy == "default" ? P : P + 1;
  return forward(images, SplitShards{}, {}).view({images.size(0), rows, vision_.hidden_size});
}

std::pair<int64_t, int64_t> ClipVisionTower::split_tokens(const SplitShards& split, size_t j, int r) const {
  // Row k is token k + 1 ("default": the class token is no row) or token k ("full"); the
  // class token goes with rank 0's rows either way.
  const bool drop = llava_.vision_feature_select_strategy == "default";
  const std::vector<int64_t>& b = split.shard_rows.at(j);
  auto token = [&](int s) { return s == 0 ? int64_t{0} : b[s] + (drop ? 1 : 0); };
  return {token(r), token(r + 1)};
}

ClipVisionTower::SplitAttention ClipVisionTower::split_attention(const SplitShards& split) const {
  const int S = split.ranks();
  const size_t n = split.grids.size();
  SplitAttention out;
  out.exchange = split.exchange;
  out.tokens.assign(S, 0);
  // The exchange joins the ranks' tokens in rank order, each rank's images in order; one
  // process attends image by image.
  std::vector<std::vector<int64_t>> base(S, std::vector<int64_t>(n));
  int64_t next = 0;
  for (int r = 0; r < S; ++r)
    for (size_t j = 0; j < n; ++j) {
      const auto [t0, t1] = split_tokens(split, j, r);
      base[r][j] = next;
      next += t1 - t0;
      out.tokens[r] += t1 - t0;
    }
  std::vector<int64_t> perm, seg, ord;
  for (size_t j = 0; j < n; ++j)
    for (int r = 0; r < S; ++r) {
      const auto [t0, t1] = split_tokens(split, j, r);
      for (int64_t t = t0; t < t1; ++t) {
        perm.push_back(base[r][j] + t - t0);
        seg.push_back(static_cast<int64_t>(j));
        ord.push_back(t);
      }
    }
  out.order = GatheredOrder::make(perm, seg, ord);
  return out;
}

at::Tensor ClipVisionTower::forward(const at::Tensor& images, const SplitShards& split,
                                    const at::Tensor& split_images) const {
  const ClipVisionConfig& c = vision_;
  auto check_images = [&](const at::Tensor& t) {
    MMSP_CHECK(t.dim() == 4 && t.size(1) == c.num_channels && t.size(2) == c.image_size && t.size(3) == c.image_size,
               "LLaVA images must be [N, ", c.num_channels, ", ", c.image_size, ", ", c.image_size, "], got ",
               t.sizes());
  };
  check_images(images);
  const int64_t N = images.size(0), side = c.patches_per_side(), P = side * side, D = c.hidden_size;
  MMSP_CHECK(split.empty() || (split_images.defined() && split_images.size(0) == int64_t(split.grids.size())),
             "LLaVA: the split images' pixels are missing");
  // Conv2d with stride = kernel: patches [N, P, C·p·p] @ weightᵀ, patches row-major.
  auto patchify = [&](const at::Tensor& t) {
    return t.reshape({t.size(0), c.num_channels, side, c.patch_size, side, c.patch_size})
        .permute({0, 2, 4, 1, 3, 5})
        .reshape({t.size(0), P, c.num_channels * c.patch_size * c.patch_size});
  };
  const at::Tensor w = patch_weight.reshape({D, -1});
  at::Tensor x = at::linear(patchify(images), w);  // [N, P, D]
  x = (at::cat({class_embedding.expand({N, 1, D}), x}, 1) + position_weight).reshape({N * (P + 1), D});
  // This rank's tokens of each split image: the class token (rank 0) and its patches.
  std::vector<at::Tensor> parts{x};
  if (!split.empty()) check_images(split_images);
  for (size_t j = 0; j < split.grids.size(); ++j) {
    const auto [t0, t1] = split_tokens(split, j, split.rank);
    const int64_t first = std::max<int64_t>(t0, 1) - 1, count = t1 - std::max<int64_t>(t0, 1);
    at::Tensor tokens = at::linear(patchify(split_images.narrow(0, j, 1)).select(0, 0).narrow(0, first, count), w);
    if (t0 == 0) tokens = at::cat({class_embedding.unsqueeze(0), tokens});
    parts.push_back(tokens + position_weight.narrow(0, t0, t1 - t0));
  }
  if (parts.size() > 1) x = at::cat(parts);
  x = leave_phase_in_backward(pre_layrnorm_->forward(x), Phase::vision);  // the tower's backward ends here
  // Each whole image is one bidirectional segment: the local kernel over all of them at once.
  const attention::TokenLayout layout{at::arange(N, at::kLong).repeat_interleave(P + 1),
                                      at::arange(P + 1, at::kLong).repeat({N})};
  const SplitAttention shared = split.empty() ? SplitAttention{} : split_attention(split);
  for (int64_t i = 0; i < feature_layer(); ++i) {
    // By value: a recomputed layer runs again after this frame (the tower outlives the
    // step), its split images' exchanges with it, in the same order on every rank.
    std::shared_ptr<Layer> layer = layers_[i];
    x = hooked_layers_.run(
        i, [this, layer, layout, shared](const at::Tensor& in) { return layer_forward(*layer, in, layout, shared); },
        x);
  }
  // The selected rows: "default" drops each image's class token (a split image's: on rank 0).
  const bool drop = llava_.vision_feature_select_strategy == "default";
  at::Tensor whole = x.narrow(0, 0, N * (P + 1));
  if (drop) whole = whole.view({N, P + 1, D}).narrow(1, 1, P).reshape({N * P, D});
  if (split.empty()) return whole;
  std::vector<at::Tensor> rows{whole};
  int64_t next = N * (P + 1);
  for (size_t j = 0; j < split.grids.size(); ++j) {
    const auto [t0, t1] = split_tokens(split, j, split.rank);
    const int64_t skip = drop && t0 == 0 ? 1 : 0;
    rows.push_back(x.narrow(0, next + skip, t1 - t0 - skip));
    next += t1 - t0;
  }
  return at::cat(rows);
}

at::Tensor ClipVisionTower::layer_forward(const Layer& l, const at::Tensor& x, const attention::TokenLayout& layout,
                                          const SplitAttention& split) const {
  const int64_t T = x.size(0), D = x.size(1), whole = layout.size();
  const int64_t heads = vision_.num_attention_heads, hd = D / heads;
  attention::AttentionOptions options;
  options.causal = false;
  at::Tensor h = l.layer_norm1->forward(x);
  at::Tensor q = l.q_proj->forward(h).view({T, heads, hd});
  at::Tensor k = l.k_proj->forward(h).view({T, heads, hd});
  at::Tensor v = l.v_proj->forward(h).view({T, heads, hd});
  at::Tensor a = attention::local_attention(q.narrow(0, 0, whole), k.narrow(0, 0, whole), v.narrow(0, 0, whole), layout,
                                            layout, options);
  if (split.exchange) {
    auto inner = [&split](const at::Tensor& gq, const at::Tensor& gk, const at::Tensor& gv) {
      return split.order.attend(gq, gk, gv);
    };
    const int64_t mine = T - whole;
    a = at::cat({a, split.exchange(q.narrow(0, whole, mine), k.narrow(0, whole, mine), v.narrow(0, whole, mine),
                                   split.tokens, inner)});
  }
  at::Tensor y = x + l.out_proj->forward(a.reshape({T, D}));
  return y + l.fc2->forward(activation(vision_.hidden_act, l.fc1->forward(l.layer_norm2->forward(y))));
}

LlavaTower::LlavaTower(const ClipVisionConfig& vision, const LlavaProjectorConfig& llava, int64_t text_hidden)
    : vision_(vision), llava_(llava), text_hidden_(text_hidden) {
  clip = std::make_shared<ClipVisionTower>(vision, llava);
  projector = std::make_shared<torch::nn::Module>();
  const bool bias = llava.multimodal_projector_bias;
  linear_1_ =
      projector->register_module("linear_1", std::make_shared<Linear>(vision.hidden_size, text_hidden, bias, 0.02));
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
  return {pixels.images.index_select(0, at::tensor(at::ArrayRef<int64_t>(rows), at::kLong).to(pixels.images.device())),
          {}};
}

TowerInput LlavaTower::no_items(const at::TensorOptions& options) const {
  return {at::zeros({0, vision_.num_channels, vision_.image_size, vision_.image_size}, options), {}};
}

void LlavaTower::add_split(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels,
                           const SplitEncoding& split, TowerInput& input) const {
  SplitShards& s = input.split = SplitShards(split);
  std::vector<at::Tensor> images{input.pixels};
  for (const plan::VisionItem& item : items) {
    MMSP_CHECK(item.kind == plan::VisionKind::image, "LLaVA takes images only");
    s.add(item, 1);
    // The image whole: each rank embeds only its tokens of it.
    const int64_t row = pixels.row_of(item, item.batch_index, 0, 1);
    MMSP_CHECK(pixels.images.defined() && pixels.images.size(0) > row, "LLaVA needs pixel values at row ", row);
    images.push_back(pixels.images.narrow(0, row, 1));
    s.pixel_rows += 1;
  }
  input.pixels = at::cat(images);
}

at::Tensor LlavaTower::encode(const TowerInput& input) const {
  const int64_t whole = input.pixels.size(0) - input.split.pixel_rows;
  at::Tensor features = clip->forward(
      input.pixels.narrow(0, 0, whole), input.split,
      input.split.pixel_rows > 0 ? input.pixels.narrow(0, whole, input.split.pixel_rows) : at::Tensor());  // [rows, D]
  at::Tensor rows = linear_2_->forward(activation(llava_.projector_hidden_act, linear_1_->forward(features)));
  return rows.reshape({-1, text_hidden_});
}

std::shared_ptr<Vlm> build_llava(const ModelConfig& config) {
  MMSP_CHECK(clip_vision_of(config) && llava_projector_of(config), "model_type ", config.model_type,
             " is not LLaVA (no CLIP vision_config)");
  auto tower =
      std::make_shared<LlavaTower>(*clip_vision_of(config), *llava_projector_of(config), config.text.hidden_size);
  auto decoder = std::make_shared<Decoder>(config.text, config.tie_word_embeddings);
  auto vlm = std::make_shared<Vlm>(config, decoder, tower);
  vlm->register_module("vision_tower", tower->clip);
  vlm->register_module("multi_modal_projector", tower->projector);
  vlm->register_module("language_model", decoder);
  return vlm;
}

}  // namespace mmsp::model
