// The Gated DeltaNet token mixer of a hybrid decoder layer ("model.layers.N.linear_attn")
// as a LibTorch module with Hugging Face's parameter names: Qwen3-Next's fused input
// projections (in_proj_qkvz, in_proj_ba, grouped by key head) or Qwen3.5's separate ones
// (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), then conv1d, A_log, dt_bias, norm,
// out_proj. The computation, on every mesh, is gated_deltanet_forward; this
// file owns the weights and maps Qwen3.5's layout onto the layer's.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "mmsp/attention/linear/gated_delta_rule.h"
#include "mmsp/model/config/text_config.h"
#include "mmsp/model/layers/gated_deltanet_layer.h"
#include "mmsp/model/layers/linear.h"

namespace mmsp::model {

// The layer's sizes from a hybrid text config (linear_* keys, rms_norm_eps) and the chunk.
GatedDeltaNetConfig gated_deltanet_config(const TextConfig& text, int64_t chunk = attention::kGatedDeltaChunk);

class GatedDeltaNet : public torch::nn::Module {
 public:
  // Parameters are drawn from the current ATen generator (seed it for replicas).
  explicit GatedDeltaNet(const TextConfig& config);

  // x [T/S, hidden] (this rank's slots) -> [T/S, hidden]; chunk: the kernel's chunk;
  // tile: --tiled-mlp's setting (GatedDeltaNetConfig::tile).
  at::Tensor forward(const at::Tensor& x, const attention::GatedDeltaContext& context,
                     int64_t chunk = attention::kGatedDeltaChunk, int64_t tile = 0) const;

  // The weights in the layer's (Qwen3-Next) layout. Qwen3.5's separate projections are
  // regrouped by key head, [q K | k K | v n·V | z n·V] and [b n | a n] (n = H_v / H_k), by
  // differentiable views, so gradients reach the checkpoint's tensors.
  GatedDeltaNetWeights weights() const;

 private:
  TextConfig config_;
  std::shared_ptr<Linear> in_proj_qkvz_, in_proj_ba_;                        // Qwen3-Next
  std::shared_ptr<Linear> in_proj_qkv_, in_proj_z_, in_proj_b_, in_proj_a_;  // Qwen3.5
  std::shared_ptr<Linear> out_proj_;
  at::Tensor conv1d_weight_, norm_weight_, A_log_, dt_bias_;
};

}  // namespace mmsp::model
