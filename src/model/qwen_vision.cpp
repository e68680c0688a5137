// Qwen2-VL vision encoder; see qwen_vision.h. Follows Hugging Face's
// Qwen2VisionTransformerPretrainedModel (rot_pos_emb, VisionAttention, PatchMerger).
#include "mmsp/model/qwen_vision.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "mmsp/attention/local_attention.h"
#include "mmsp/core/check.h"

namespace mmsp::model {
namespace {

at::Tensor activation(const std::string& name, const at::Tensor& x) {
  if (name == "quick_gelu") return x * at::sigmoid(1.702 * x);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "silu") return at::silu(x);
  MMSP_CHECK(false, "vision_config.hidden_act '", name, "' is not supported by the Qwen2-VL encoder");
  return x;
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

LayerNorm::LayerNorm(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
  bias = register_parameter("bias", at::zeros({dim}));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

QwenVisionEncoder::PatchEmbed::PatchEmbed(const QwenVisionConfig& c) {
  proj_weight = at::randn({c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size,
                           c.patch_size}) * c.initializer_range;
  auto proj = std::make_shared<torch::nn::Module>();
  proj->register_parameter("weight", proj_weight);
  register_module("proj", proj);
}

QwenVisionEncoder::Block::Block(const QwenVisionConfig& c) {
  const double s = c.initializer_range;
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(c.hidden_size, 1e-6));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(c.hidden_size, 1e-6));
  attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", std::make_shared<Linear>(c.hidden_size, 3 * c.hidden_size, true, s));
  proj = attn->register_module("proj", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, s));
  mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", std::make_shared<Linear>(c.hidden_size, c.intermediate_size, true, s));
  fc2 = mlp->register_module("fc2", std::make_shared<Linear>(c.intermediate_size, c.hidden_size, true, s));
}

QwenVisionEncoder::Merger::Merger(const QwenVisionConfig& c) {
  const int64_t width = c.hidden_size * c.spatial_merge_size * c.spatial_merge_size;
  ln_q = register_module("ln_q", std::make_shared<LayerNorm>(c.hidden_size, 1e-6));
  mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("0", std::make_shared<Linear>(width, width, true, c.initializer_range));
  fc2 = mlp->register_module("2", std::make_shared<Linear>(width, c.out_hidden_size, true, c.initializer_range));
}

QwenVisionEncoder::QwenVisionEncoder(const QwenVisionConfig& c) : config_(c) {
  MMSP_CHECK(c.window_size == 0 && c.num_position_embeddings == 0 && c.deepstack_visual_indexes.empty(),
             "this encoder is Qwen2-VL's; Qwen2.5-VL windows and Qwen3-VL position tables / deepstack "
             "are not implemented yet");
  MMSP_CHECK(c.head_dim() % 4 == 0, "vision head size ", c.head_dim(),
             " must divide by 4 (2-D rotary: h and w halves)");
  patch_embed_ = register_module("patch_embed", std::make_shared<PatchEmbed>(c));
  blocks_ = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.depth; ++i)
    block_list_.push_back(blocks_->register_module(std::to_string(i), std::make_shared<Block>(c)));
  merger_ = register_module("merger", std::make_shared<Merger>(c));
}

at::Tensor vision_patch_positions(const std::vector<plan::Grid>& grids, int64_t m) {
  std::vector<at::Tensor> parts;
  for (const plan::Grid& g : grids) {
    // hpos/wpos [h, w] -> merge windows: (h/m, m, w/m, m) -> (h/m, w/m, m, m) -> flat
    at::Tensor hpos = at::arange(g[1], at::kLong).unsqueeze(1).expand({g[1], g[2]});
    at::Tensor wpos = at::arange(g[2], at::kLong).unsqueeze(0).expand({g[1], g[2]});
    auto windowed = [&](const at::Tensor& p) {
      return p.reshape({g[1] / m, m, g[2] / m, m}).permute({0, 2, 1, 3}).flatten();
    };
    parts.push_back(at::stack({windowed(hpos), windowed(wpos)}, -1).repeat({g[0], 1}));
  }
  return parts.empty() ? at::zeros({0, 2}, at::kLong) : at::cat(parts);
}

at::Tensor QwenVisionEncoder::block_forward(const Block& b, const at::Tensor& x, const at::Tensor& cos,
                                            const at::Tensor& sin,
                                            const std::vector<plan::Grid>& grids) const {
  const int64_t N = x.size(0), H = config_.num_heads, D = config_.head_dim();
  at::Tensor qkv = b.qkv->forward(b.norm1->forward(x)).view({N, 3, H, D});
  at::Tensor q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2);  // [N, H, D]
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  q = (q.to(wide) * cos + rotate_half(q.to(wide)) * sin).to(x.scalar_type());
  k = (k.to(wide) * cos + rotate_half(k.to(wide)) * sin).to(x.scalar_type());
  // One segment per frame, bidirectional: attention never leaves a frame.
  std::vector<int64_t> seg, ord;
  int64_t frame = 0;
  for (const plan::Grid& g : grids)
    for (int64_t t = 0; t < g[0]; ++t, ++frame)
      for (int64_t i = 0; i < g[1] * g[2]; ++i) seg.push_back(frame), ord.push_back(i);
  attention::TokenLayout layout{at::tensor(at::ArrayRef<int64_t>(seg), at::kLong).clone(),
                                at::tensor(at::ArrayRef<int64_t>(ord), at::kLong).clone()};
  attention::AttentionOptions options;
  options.causal = false;
  at::Tensor attn = attention::local_attention(q, k, v, layout, layout, options);
  at::Tensor h = x + b.proj->forward(attn.reshape({N, H * D}));
  return h + b.fc2->forward(activation(config_.hidden_act, b.fc1->forward(b.norm2->forward(h))));
}

at::Tensor QwenVisionEncoder::forward(const at::Tensor& pixel_values,
                                      const std::vector<plan::Grid>& grids) const {
  const QwenVisionConfig& c = config_;
  const int64_t m = c.spatial_merge_size;
  int64_t patches = 0;
  for (const plan::Grid& g : grids) {
    MMSP_CHECK(g[1] % m == 0 && g[2] % m == 0, "grid [", g[0], ", ", g[1], ", ", g[2],
               "] must divide by spatial_merge_size ", m);
    patches += g[0] * g[1] * g[2];
  }
  const int64_t patch_dim = c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size;
  MMSP_CHECK(pixel_values.dim() == 2 && pixel_values.size(0) == patches && pixel_values.size(1) == patch_dim,
             "pixel_values ", pixel_values.sizes(), " must be [", patches, ", ", patch_dim,
             "] for these grids (C·tp·p·p = ", patch_dim, ")");
  if (patches == 0) return at::zeros({0, c.out_hidden_size}, pixel_values.options().dtype(
                                                                 patch_embed_->proj_weight.scalar_type()));
  // The Conv3d with stride = kernel is a matmul over flattened patches.
  at::Tensor x = at::linear(pixel_values, patch_embed_->proj_weight.reshape({c.hidden_size, patch_dim}));

  // 2-D rotary: head_dim/4 frequencies for h, as many for w, then doubled.
  const int64_t quarter = c.head_dim() / 4;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor inv_freq = at::pow(10000.0, at::arange(0, 2 * quarter, 2, f64) / double(2 * quarter)).reciprocal();
  at::Tensor pos = vision_patch_positions(grids, m).to(at::kDouble);             // [N, 2]
  at::Tensor freqs = (pos.unsqueeze(-1) * inv_freq).flatten(1);                  // [N, head_dim/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);                     // [N, 1, head_dim]
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor cos = emb.cos().to(wide).to(x.device()), sin = emb.sin().to(wide).to(x.device());

  for (const auto& block : block_list_) x = block_forward(*block, x, cos, sin, grids);
  at::Tensor merged = merger_->ln_q->forward(x).reshape({-1, c.hidden_size * m * m});
  return merger_->fc2->forward(at::gelu(merger_->fc1->forward(merged)));
}

}  // namespace mmsp::model
