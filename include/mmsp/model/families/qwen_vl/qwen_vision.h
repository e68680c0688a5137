// The Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision encoders as LibTorch modules with Hugging
// Face's names: patch_embed.proj, blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.*}, and
// Qwen2/2.5-VL's merger.{ln_q, mlp.0, mlp.2} or Qwen3-VL's merger.{norm, linear_fc1,
// linear_fc2}, pos_embed and deepstack_merger_list.K. It encodes whole items (Vision DP
// gives each rank whole images): patches in the processor's merge-window order, 2-D
// rotary positions, bidirectional attention within each frame (the local kernel, one
// segment per frame), then spatial_merge_size² patches -> one LLM row. Qwen2.5-VL puts
// the merged patches in window order (window_index.h), attends inside each window except
// in fullatt_block_indexes, uses RMSNorm and a gated MLP, and restores the processor's
// order after the merger. Qwen3-VL adds a patch-embedding bias, a learned position table
// interpolated to each grid, and the deepstack features: blocks listed in
// deepstack_visual_indexes feed extra mergers.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "mmsp/attention/token_layout.h"
#include "mmsp/model/families/qwen_vl/qwen_variant.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/hooks/hooked_blocks.h"
#include "mmsp/model/layers/linear.h"
#include "mmsp/model/layers/rotary.h"
#include "mmsp/model/vision/gathered_order.h"
#include "mmsp/model/vision/vision_tower.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::model {

// The encoder's output: rows [Σ t·h·w / m², out_hidden_size] and, for Qwen3-VL, one
// tensor of the same shape per deepstack level.
struct VisionOutput {
  at::Tensor rows;
  std::vector<at::Tensor> deepstack;
};

class QwenVisionEncoder : public torch::nn::Module, public VisionTower {
 public:
  // variant: qwen2_vl, qwen2_5_vl or qwen3_vl (names and parts differ).
  QwenVisionEncoder(const QwenVisionConfig& config, QwenVariant variant);

  // pixel_values [N_patches, C·tp·p·p] of the given items (grids in patches, rows in
  // the processor's order). No items (N_patches = 0) is only for hooked blocks: it runs
  // each block on no rows, so that its hooks are called as on a rank with items.
  // `split`: this rank's shards of items split over the context group (vision-tower SP),
  // their pixel rows after the whole items'; their rows follow the whole items' rows.
  VisionOutput forward(const at::Tensor& pixel_values, const std::vector<plan::Grid>& grids,
                       const SplitShards& split = {}) const;

  int deepstack_levels() const override { return static_cast<int>(deepstack_.size()); }
  // The blocks as hook units, recomputed in the backward when set (hooked_blocks.h).
  HookedBlocks& blocks() override { return hooked_blocks_; }

  // As a VisionTower (vision_tower.h): the items' patch rows and grids; rows
  // [V, out_hidden_size · (1 + deepstack levels)], the merger's row, then each level's.
  TowerInput gather(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels) const override;
  void add_split(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels, const SplitEncoding& split,
                 TowerInput& input) const override;
  TowerInput no_items(const at::TensorOptions& options) const override;
  at::Tensor encode(const TowerInput& input) const override;
  int64_t row_width() const override { return config_.out_hidden_size * (1 + deepstack_levels()); }

  const QwenVisionConfig& config() const { return config_; }

 private:
  struct PatchEmbed : torch::nn::Module {
    PatchEmbed(const QwenVisionConfig& c, bool bias);
    at::Tensor proj_weight;  // [embed, C, tp, p, p], as HF's Conv3d
    at::Tensor proj_bias;    // Qwen3-VL only
  };
  enum class Variant { qwen2, qwen2_5, qwen3 };
  // LayerNorm (Qwen2-VL, Qwen3-VL) or RMSNorm (Qwen2.5-VL) under one name.
  struct Norm {
    Norm(torch::nn::Module& parent, const std::string& name, int64_t dim, bool rms);
    at::Tensor forward(const at::Tensor& x) const;
    std::shared_ptr<LayerNorm> layer;
    std::shared_ptr<RMSNorm> rms;
  };
  struct Block : torch::nn::Module {
    Block(const QwenVisionConfig& c, Variant variant);
    at::Tensor mlp_forward(const at::Tensor& x, const std::string& act) const;
    std::unique_ptr<Norm> norm1, norm2;
    std::shared_ptr<torch::nn::Module> attn, mlp;
    std::shared_ptr<Linear> qkv, proj;
    // mlp.fc1/fc2 (Qwen2-VL), mlp.linear_fc1/2 (Qwen3-VL): fc2(act(fc1 x));
    // Qwen2.5-VL mlp.gate_proj/up_proj/down_proj: down(act(gate x) · up x)
    std::shared_ptr<Linear> fc1, fc2, gate, up, down;
  };
  // Qwen2-VL: ln_q, mlp.0, mlp.2; Qwen3-VL: norm, linear_fc1, linear_fc2, with the norm
  // after the merge (postshuffle) for the deepstack mergers.
  struct Merger : torch::nn::Module {
    Merger(const QwenVisionConfig& c, Variant variant, bool postshuffle_norm);
    at::Tensor forward(const at::Tensor& x, int64_t merged_width) const;
    std::unique_ptr<Norm> norm;
    std::shared_ptr<Linear> fc1, fc2;
    bool postshuffle_norm;
  };
  // What every block's attention over the split items shares (one step).
  struct SplitAttention {
    SplitExchange exchange;
    std::vector<int64_t> tokens;    // patches each context rank exchanges
    GatheredOrder frames, windows;  // full blocks; Qwen2.5-VL's windowed blocks
    bool active() const { return static_cast<bool>(exchange); }
  };
  SplitAttention split_attention(const SplitShards& split) const;
  // Rows [0, segments.size()) are whole items' (local attention); the rest this rank's
  // shards of the split items (the exchange). `full`: a full-attention block.
  at::Tensor block_forward(const Block& b, const at::Tensor& x, const RotaryTable& rotary,
                           const attention::TokenLayout& segments, const SplitAttention& split, bool full) const;
  // Qwen3-VL's interpolated position rows for patches (h, w) [N, 2] of grid g.
  at::Tensor interpolated_positions(const plan::Grid& g, const at::Tensor& hw) const;
  // The patch embedding (and Qwen3-VL's positions) of the whole items and the split
  // shards; `whole_hw` / `split_hw`: their patches' (h, w).
  at::Tensor embed_patches(const at::Tensor& pixel_values, const std::vector<plan::Grid>& grids,
                           const at::Tensor& whole_hw, const SplitShards& split,
                           const std::vector<at::Tensor>& split_hw) const;
  // The blocks (full ones over `frames`, Qwen2.5-VL's windowed ones over `windows`),
  // the deepstack mergers at their indexes and the merger.
  VisionOutput run_blocks(at::Tensor x, const RotaryTable& rotary, const attention::TokenLayout& frames,
                          const attention::TokenLayout& windows, const SplitAttention& shared) const;

  QwenVisionConfig config_;
  Variant variant_ = Variant::qwen2;
  bool qwen3_ = false;
  HookedBlocks hooked_blocks_;
  std::shared_ptr<PatchEmbed> patch_embed_;
  std::shared_ptr<Embedding> pos_embed_;  // Qwen3-VL: [num_position_embeddings, hidden]
  std::shared_ptr<torch::nn::Module> blocks_;
  std::vector<std::shared_ptr<Block>> block_list_;
  std::shared_ptr<Merger> merger_;
  std::vector<std::shared_ptr<Merger>> deepstack_;
};

// 2-D rotary positions (h, w) of each patch of the items, in merge-window order: [N, 2].
at::Tensor vision_patch_positions(const std::vector<plan::Grid>& grids, int64_t merge);

}  // namespace mmsp::model
