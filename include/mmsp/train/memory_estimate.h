// The memory preflight: each rank's bytes for one training step, estimated from the
// config, the parameter shapes (counted on a meta-device skeleton, nothing allocated),
// the mesh and the flags, so that a run that cannot fit stops before it allocates.
// Parameters, masters, gradients and AdamW state are exact; activations follow the
// formula in docs/finetune.md (what autograd keeps per token and decoder layer, plus
// the largest transient working set and the logits). With T tokens per rank, L decoder
// layers, a = the elements autograd keeps per token and layer, h hidden, V vocabulary,
// b bytes per compute element, n = min(--loss-chunk, T):
//   activations  none:      L·T·a·b
//                decoder/all: L·T·h·b (each layer's input) + T·a·b (the one layer
//                           being recomputed in the backward)
//   working set  max(3·T·I·b, 4·H·block²·4, hybrid: 3·T·H_v·(2K + V)·w + 3·T·(2·H_k·K + H_v·V)·b)
//                (the MLP's backward, one attention block, a Gated DeltaNet layer's
//                rule and conv; w = max(b, 4))
//   logits       n·V·(b + 12)  (one chunk: compute-dtype logits, fp32 copy, exp,
//                gradient) + 4·T (per-token log-sum-exp) + max(b, 4)·T·h (the hidden
//                state's gradient, summed in fp32 or fp64)
// With --shard over W ranks (N parameters, N_l the largest decoder layer's, N_h the LM
// head's (the embedding when tied), N_e an untied embedding's, N_r the rest's, buckets
// of B = 25 MiB):
//   optimizer   masters + moments 3·m·N/W; gradients N·b + 2·min(N, B/b)·m
//   gradients   gradients (N_r + max(N_l, N_h) + T·h)·b + 2·min(N, B/b)·m (the token
//               lookup's gradient is T rows of h, not a dense N_e)
//   parameters  and parameters (N_r + 2·max(N_l, N_h, N_e))·b
// The vision encoder's activations are not counted (small next to the decoder's).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mmsp/model/config.h"
#include "mmsp/model/recompute.h"
#include "mmsp/train/shard_level.h"

namespace mmsp::train {

struct MemoryEstimateInputs {
  at::ScalarType compute_dtype = at::kFloat;  // the model's parameters and activations
  at::ScalarType master_dtype = at::kFloat;   // optimizer-side weights (= compute unless mixed)
  int64_t tokens_per_rank = 0;                // T: this rank's tokens of a step
  int64_t attention_block = 256;              // query/key block of the attention kernel
  int64_t loss_chunk = 0;                     // tokens per chunk of the LM head (0: all T at once)
  model::ActivationCheckpointing checkpointing = model::ActivationCheckpointing::none;
  ShardLevel shard_level = ShardLevel::none;  // --shard
  int shard_world = 1;                         // ... over this many ranks
};

struct MemoryEstimate {
  int64_t parameter_count = 0;
  int64_t parameters = 0;      // model parameters in the compute dtype
  int64_t master_weights = 0;  // fp32 copies (mixed precision only)
  int64_t gradients = 0;       // master-dtype gradients (+ the compute-dtype grads of backward)
  int64_t optimizer = 0;       // AdamW's two moments in the master dtype
  int64_t activations = 0;     // kept for backward by the decoder layers
  int64_t working_set = 0;     // the largest transient of one layer (MLP or attention block)
  int64_t logits = 0;          // the LM head's output and the loss's fp32 copies
  int64_t total() const {
    return parameters + master_weights + gradients + optimizer + activations + working_set + logits;
  }
  // Rows "name  bytes  formula", for the start-up print and the error.
  std::vector<std::pair<std::string, int64_t>> parts() const;
  std::string table() const;
};

// `shapes`: every parameter's shape (model::ExpectedShapes from a meta skeleton).
MemoryEstimate estimate_memory(const model::ModelConfig& config,
                               const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                               const MemoryEstimateInputs& inputs);

// "1.50 GiB", "312.0 MiB", "4.0 KiB", "17 B".
std::string format_bytes(int64_t bytes);

// Throws mmsp::Error when estimate.total() > limit_bytes (> 0), naming every part, the
// limit and where it came from, and the flags that shrink each part. limit ≤ 0: no check.
void check_memory_fits(const MemoryEstimate& estimate, int64_t limit_bytes, const std::string& limit_source);

}  // namespace mmsp::train
