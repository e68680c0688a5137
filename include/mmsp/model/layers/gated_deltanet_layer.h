// The Gated DeltaNet layer of Qwen3-Next / Qwen3.5 hybrid decoders, with Hugging
// Face parameter names, run on any context mesh: local, Ulysses over heads (one
// all-to-all of q|k|v|b|a in, one of the output back), ring state passing on the
// zigzag layout (attention/gated_delta_ring.h), or both (Ulysses inside each ring
// rank), and under a mixed placement only the split segments exchanged (whole ones at
// home). The algorithm (the chunked rule, its ring) and the placement on the mesh
// (gated_delta_context.h) are in attention/; the module that owns the parameters is
// gated_deltanet.h.
//
//   x [T/S, hidden] -> in_proj_qkvz, in_proj_ba -> causal depthwise conv1d + SiLU over
//   q|k|v -> L2-norm q, k; β = sigmoid(b); g = −exp(A_log)·softplus(a + dt_bias)
//   -> gated delta rule (q, k repeated to the value heads) -> RMSNorm(o)·w·silu(z)
//   -> out_proj -> [T/S, hidden]
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mmsp/attention/linear/gated_delta_context.h"

namespace mmsp::model {

struct GatedDeltaNetConfig {
  int64_t hidden_size = 64;
  int64_t num_key_heads = 2;    // linear_num_key_heads (H_k)
  int64_t num_value_heads = 4;  // linear_num_value_heads (H_v), a multiple of H_k
  int64_t key_head_dim = 16;    // linear_key_head_dim (K)
  int64_t value_head_dim = 16;  // linear_value_head_dim (V)
  int64_t conv_kernel = 4;      // linear_conv_kernel_dim (W)
  double rms_norm_eps = 1e-6;
  int64_t chunk = 64;  // the kernel's chunk (mmsp's, not a config.json field)
  // --tiled-mlp's setting, which also tiles the token mixer (mmsp's): 0 whole, -1 auto,
  // or rows a tile. The conv and rule run over sequence tiles of the share where it is
  // whole (attention/gated_delta_tiles.h), the gated norm and out_proj over token tiles.
  int64_t tile = 0;

  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  void check() const;
};

// Parameters as in Hugging Face's Qwen3NextGatedDeltaNet (names without the
// "model.layers.N.linear_attn." prefix). in_proj_qkvz's rows are grouped by key
// head: [q (K) | k (K) | v (H_v/H_k·V) | z (H_v/H_k·V)] per key head; in_proj_ba's
// [b (H_v/H_k) | a (H_v/H_k)] per key head; the conv channels are [q | k | v].
struct GatedDeltaNetWeights {
  at::Tensor in_proj_qkvz;   // [2·H_k·K + 2·H_v·V, hidden]
  at::Tensor in_proj_ba;     // [2·H_v, hidden]
  at::Tensor conv1d_weight;  // [conv_dim, 1, W]   ("conv1d.weight")
  at::Tensor A_log;          // [H_v]
  at::Tensor dt_bias;        // [H_v]
  at::Tensor norm_weight;    // [V]                ("norm.weight")
  at::Tensor out_proj;       // [hidden, H_v·V]    ("out_proj.weight")

  // Random weights of a plausible scale (tests, benchmarks), seeded.
  static GatedDeltaNetWeights random(const GatedDeltaNetConfig& config, const at::TensorOptions& options,
                                     uint64_t seed);
  // (Hugging Face name, tensor), in declaration order.
  std::vector<std::pair<std::string, at::Tensor>> named() const;
  void check(const GatedDeltaNetConfig& config) const;
};

// x [T/S, hidden]: this rank's slots (its ulysses slice of its ring share) -> [T/S, hidden].
// Padding slots give zero. Every check runs before the first collective.
at::Tensor gated_deltanet_forward(const GatedDeltaNetWeights& weights, const GatedDeltaNetConfig& config,
                                  const at::Tensor& x, const attention::GatedDeltaContext& context);

// Bytes this rank sends per layer forward for Ulysses: two all-to-alls,
// (U−1)/U·(T/S)·[(2·H_k·K + H_v·V + 2·H_v) + H_v·V]·b.
int64_t gated_delta_ulysses_bytes(const GatedDeltaNetConfig& config, int64_t local_tokens, int ulysses,
                                  int64_t element_size);
// The all-to-all-v of a mixed placement, rank u of the group exchanging tokens[u] slots: its
// own tokens' inputs out, the others' outputs back:
// [(U−1)·tokens[u]·(2·H_k·K + H_v·V + 2·H_v) + Σ_{p≠u} tokens[p]·H_v·V]·b / U.
int64_t gated_delta_ulysses_bytes(const GatedDeltaNetConfig& config, const std::vector<int64_t>& tokens, int rank,
                                  int64_t element_size);

}  // namespace mmsp::model
