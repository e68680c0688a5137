// The memory preflight: each rank's bytes for one training step, estimated from the
// config, the parameters and their hooked units (counted on a meta-device skeleton,
// nothing allocated),
// the mesh and the flags, so that a run that cannot fit stops before it allocates.
//
// A step is a sequence of moments, each holding different things: the parameters,
// masters and AdamW moments are held throughout; the forward adds the activations and
// a layer's working set; the loss's forward a block's logits, its backward their
// softmax and the head's gradient; the backward through the layers the gradients; the
// update the gradients it steps with and its temporaries. The estimate is what is held plus the largest moment (each
// moment's parts summed: an upper bound within it). Parameters, masters, gradients and
// AdamW state are exact; activations follow the formula in docs/finetune.md (what
// autograd keeps per token and decoder layer). The transients of each moment were
// found by measuring the peak of the backward and of the update apart (bench memory's
// update_peak_bytes) on the released Qwen3.5-0.8B and Qwen2-VL-7B at every level;
// docs/finetune.md has every part's formula, docs/bench/sharding.md the measured rows.
// The vision tower's part depends on each step's items and who encodes them: the run's
// preflight leaves it at zero and each step adds its busiest rank's (vision_load.h)
// before the step's first collective.
// --tiled-mlp and --offload-activations change the activations and the working set
// (docs/finetune.md has the formulas).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mmsp/model/config/config.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/parallel/zero/shard_level.h"
#include "mmsp/parallel/zero/shard_unit_use.h"

namespace mmsp::model {
class Vlm;
}  // namespace mmsp::model

namespace mmsp::train {

struct MemoryEstimateInputs {
  at::ScalarType compute_dtype = at::kFloat;  // the model's parameters and activations
  at::ScalarType master_dtype = at::kFloat;   // optimizer-side weights (= compute unless mixed)
  int64_t tokens_per_rank = 0;                // T: this rank's tokens of a step
  // A step's slots a rank holds, padding included (plan::ShardMap::local_length), when
  // known and more than tokens_per_rank: the activations and logits are the slots'.
  int64_t local_length = 0;
  int64_t attention_block = 256;  // query/key block of the attention kernel
  int64_t loss_chunk = 0;         // tokens per chunk of the LM head (0: all T at once)
  model::ActivationCheckpointing checkpointing = model::ActivationCheckpointing::none;
  // --offload-activations on a device that is not the host: the recomputed layers'
  // inputs wait in host memory (on the CPU they stay where they are: pass false).
  bool offload_activations = false;
  int64_t mlp_tile = 0;  // tokens per tile of the MLP (--tiled-mlp resolved); 0: untiled
  parallel::ShardLevel shard_level = parallel::ShardLevel::none;  // --shard
  int shard_world = 1;                                            // ... over this many ranks
  int expert_shard_world = 0;  // ... and the expert weights over this many (--expert: world / expert); 0: shard_world
  // The context group's ring degree: with a ring, a Gated DeltaNet layer also keeps the
  // map from each run's initial state to its outputs (state passing, gated_delta_ring.h).
  int ring = 1;
  int ulysses = 1;  // ... and its Ulysses degree: a sequence tile of the mixer holds H/U heads
};

// A Gated DeltaNet token mixer's bytes per token (this rank's token-head pairs: Ulysses
// trades tokens for heads), b the model's dtype and `wide` fp32 under 16-bit (else b):
//  kept (forward to backward): the conv's input, pre-activation and output
//    (3·(2·H_k·K + H_v·V)·b); the rule's normalised q and k and its output
//    (H_v·(2K + V)·b: it keeps no copy in chunk slots, gated_delta_rule.h); the gate z and
//    the gated norm's tensors (H_v·V·(2·wide + 7·b), casts included);
//  backward (its transients at the step's peak): in 16-bit the peak comes in the gated
//    norm's fp32 backward, beside the rule's three gradients in token order and the conv's
//    two (H_v·(2K + V)·b + 3·H_v·V·wide + 2·(2·H_k·K + H_v·V)·b); without casts, at the
//    rule's gradients and the output's (H_v·(2K + V)·b + H_v·V·b); under a ring (ring > 1)
//    also each token's map q_eff from its run's initial state and its gradient (2·H_v·K·wide).
// Measured at Qwen3.5-0.8B's shapes, 2,048 tokens (GatedDeltaNetLayer.ReleasedShapesStep…
// in test_linear_attention; the input projection's weight rows, copied once a forward, not
// counted): bf16 kept 90.5 KB a token (formula 94.2), peak 151.8 (155.6); fp32 kept 143.9
// (172.0), peak 177.4 (204.8).
//
// Over sequence tiles (tile > 0: --tiled-mlp's rows, where no ring is: gated_delta_tiles.h)
// the layer keeps its inputs to the rule and to the gated norm, what travels
// ((2·H_k·K + H_v·V + 2·H_v)·b) and o | z (2·H_v·V·b), and one state per tile border
// (H_v·K·V·wide / tile); its backward adds the gradient of what travels and the layer
// input's (h·b): o | z's gradient takes the place of o | z, which the norm's tiles free as
// they hand it over. And one tile's work at a time: the larger of the conv and rule's
// (their untiled kept + backward bytes, ÷ the Ulysses degree: a share row holds H/U heads)
// and the gated norm's, per row of the tile. Measured fp32 at the same shapes, tiles of
// 256, from the growth of 1,024 to 2,048 tokens: kept 45,254 B a token (formula 45,184),
// the backward above it 28,800 (formula 28,800; 41,088 when it counted o | z's gradient
// beside o | z); bf16 kept 24.7 KB, backward 14.4 (14.4).
struct GatedDeltaLayerBytes {
  int64_t kept = 0, backward = 0;  // per token
  int64_t tile = 0;                // bytes: one tile's work, tiled
};
GatedDeltaLayerBytes gated_delta_layer_bytes(const model::TextConfig& text, int64_t element_size, int ring,
                                             int64_t tile = 0, int ulysses = 1);

// Every part is what one rank holds at some moment of a step. The parameters, masters
// and moments are held throughout; each moment of the step (the forward, the loss, the
// backward through the layers, the weight update) adds its own parts, and the step
// needs the held part plus the largest moment.
struct MemoryEstimate {
  int64_t parameter_count = 0;
  // Held through the step.
  int64_t parameters = 0;      // the model's weights in the compute dtype (stage 3: outside the units)
  int64_t master_weights = 0;  // the optimizer's copies (mixed precision, or sharded)
  int64_t optimizer = 0;       // AdamW's two moments in the master dtype
  // Stage 3's units gathered besides: in the forward, the loss and the backward.
  int64_t gathered_forward = 0, gathered_loss = 0, gathered_backward = 0;
  int64_t gathered_vision = 0;  // ... and in the vision tower's backward (a block and the next)
  int64_t activations = 0;      // kept for backward by the decoder layers (on the device)
  int64_t offloaded = 0;        // ... and in host memory (--offload-activations): not in total()
  int64_t working_set = 0;      // the largest transient of the layer being computed (MLP, attention block, token mixer)
  int64_t logits = 0;           // the loss's forward: one block's logits, their wide copy, shift and exp
  int64_t logits_backward = 0;  // its backward: a block's logits and softmax, the hidden state's gradient
  int64_t head_gradient = 0;    // the LM head's gradient, made whole by the loss's backward
  int64_t head_reduction = 0;   // --shard gradients: its shard and a round as its hook reduces it
  int64_t gradients = 0;        // the backward's end (stages 2, 3: one unit's, and every reduced shard)
  // The decoder's backward runs its layers last to first: each frees its input (or its
  // activations) and adds its reduced shard (stages 2, 3). Its moment is priced where
  // the two sum highest, at the last layer or at the first: the inputs still kept there,
  // the layer recomputed, and the gradients so far: the kept weights', one layer's and
  // the shards reduced by then (the token lookup's rows come after the layers). A layer's reduce-scatter rounds come
  // after its recomputed activations are gone (a moment of their own). Without a shard
  // level above optimizer these are the activations and the whole gradients.
  int64_t inputs_left = 0, recomputed_layer = 0, backward_gradients = 0, reduction_rounds = 0;
  int64_t update_gradients = 0;    // what the update steps with (the masters', or the shards)
  int64_t update_working_set = 0;  // its largest transients (reductions, AdamW's, gathers)
  // The busiest rank's vision tower in a step (vision_load.h): its pixels, blocks'
  // activations and rows, kept from its forward to its backward, and one block's
  // transients in its backward (which runs last, the decoder's activations freed).
  int64_t vision = 0, vision_working_set = 0;
  // --prefetch-pixels on the CPU: the next step's pixels, decoded during this step
  // (train/memory/vision_load.h's prefetched_pixel_bytes); held through every moment.
  int64_t next_pixels = 0;

  struct Moment {
    std::string name;
    std::vector<std::string> parts;  // names in parts()
  };
  // "parameters" … "update working set": every part by name, for the print and the benchmark.
  std::vector<std::pair<std::string, int64_t>> parts() const;
  std::vector<Moment> moments() const;
  int64_t bytes_of(const std::vector<std::string>& part_names) const;
  int64_t held() const;
  int64_t total() const;  // held() + the largest moment
  // What a rank holds once the update is done: the held part and the gradients.
  int64_t training_state() const;
  std::string table() const;
};

// The parameters a run holds, as ZeRO would hold them: what the preflight prices,
// counted from a model built on the meta device (nothing allocated) and the units
// parallel::parallelize would hook on it, not from parameter names.
struct ParameterLayout {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;  // every parameter, in the model's order
  std::vector<int> unit_of;                  // per parameter: its hooked unit (parallel::unit_index_of), −1: none
  std::vector<parallel::ShardUnitUse> uses;  // per unit (parallel::shard_unit_uses)
  // per parameter: frozen (--freeze: no master, optimizer state or gradient; whole on every
  // rank at every --shard level); empty: every parameter trains
  std::vector<bool> frozen;
};
ParameterLayout parameter_layout(const model::Vlm& skeleton);

MemoryEstimate estimate_memory(const model::ModelConfig& config, const ParameterLayout& layout,
                               const MemoryEstimateInputs& inputs);

// "1.50 GiB", "312.0 MiB", "4.0 KiB", "17 B".
std::string format_bytes(int64_t bytes);

// Throws mmsp::Error when estimate.total() > limit_bytes (> 0), naming every part, the
// limit and where it came from, and the flags that shrink each part. limit ≤ 0: no check.
// `what` opens the message ("step 3: ..."), when given.
void check_memory_fits(const MemoryEstimate& estimate, int64_t limit_bytes, const std::string& limit_source,
                       const std::string& what = "");

}  // namespace mmsp::train
