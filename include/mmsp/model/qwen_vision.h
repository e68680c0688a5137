// The Qwen2-VL vision encoder as LibTorch modules with Hugging Face's names
// (visual.patch_embed.proj, visual.blocks.N.{norm1, attn.qkv, attn.proj, norm2,
// mlp.fc1, mlp.fc2}, visual.merger.{ln_q, mlp.0, mlp.2}). It encodes whole images
// (Vision DP gives each rank whole items): patches in the processor's merge-window
// order, 2-D rotary positions, bidirectional attention within each frame (the local
// kernel, one segment per frame), then spatial_merge_size² patches -> one LLM row.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "mmsp/model/linear.h"
#include "mmsp/model/vision_config.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::model {

class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  double eps;
};

class QwenVisionEncoder : public torch::nn::Module {
 public:
  explicit QwenVisionEncoder(const QwenVisionConfig& config);

  // pixel_values [N_patches, C·tp·p·p] of the given items (grids in patches, rows in
  // the processor's order) -> embeddings [Σ t·h·w / m², out_hidden_size].
  at::Tensor forward(const at::Tensor& pixel_values, const std::vector<plan::Grid>& grids) const;

  const QwenVisionConfig& config() const { return config_; }

 private:
  struct PatchEmbed : torch::nn::Module {
    explicit PatchEmbed(const QwenVisionConfig& c);
    at::Tensor proj_weight;  // [embed, C, tp, p, p], as HF's Conv3d (no bias)
  };
  struct Block : torch::nn::Module {
    explicit Block(const QwenVisionConfig& c);
    std::shared_ptr<LayerNorm> norm1, norm2;
    std::shared_ptr<torch::nn::Module> attn, mlp;
    std::shared_ptr<Linear> qkv, proj, fc1, fc2;
  };
  struct Merger : torch::nn::Module {
    explicit Merger(const QwenVisionConfig& c);
    std::shared_ptr<LayerNorm> ln_q;
    std::shared_ptr<torch::nn::Module> mlp;
    std::shared_ptr<Linear> fc1, fc2;  // mlp.0, mlp.2
  };
  at::Tensor block_forward(const Block& b, const at::Tensor& x, const at::Tensor& cos,
                           const at::Tensor& sin, const std::vector<plan::Grid>& grids) const;

  QwenVisionConfig config_;
  std::shared_ptr<PatchEmbed> patch_embed_;
  std::shared_ptr<torch::nn::Module> blocks_;
  std::vector<std::shared_ptr<Block>> block_list_;
  std::shared_ptr<Merger> merger_;
};

// 2-D rotary positions (h, w) of each patch of the items, in merge-window order: [N, 2].
at::Tensor vision_patch_positions(const std::vector<plan::Grid>& grids, int64_t merge);

}  // namespace mmsp::model
