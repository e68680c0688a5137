// The one interface every vision-language model family implements: the forward of a
// step on this rank's shard, the vision rows alone (benchmarks, tests), the activation
// checkpointing setting, and the parameters by checkpoint name (torch::nn::Module's
// named_parameters()). The trainer, the benchmarks and the tests hold a Vlm and never
// ask which family it is; a family is built by its registry entry (family.h).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <vector>

#include "mmsp/attention/local_attention.h"
#include "mmsp/dist/group.h"
#include "mmsp/model/config.h"
#include "mmsp/model/decoder.h"
#include "mmsp/model/hooked_blocks.h"
#include "mmsp/model/recompute.h"
#include "mmsp/model/vision_routing.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::model {

// Pixels in the family's layout (PixelGeometry, pixel_geometry.h): items in batch order
// (image_grid_thw order), each item's rows one after the other along dim 0. Qwen-VL:
// rows of flattened patches [Σ patches, C·tp·p·p]; LLaVA: whole images [N, C, S, S].
// Either the whole batch (the offset lists empty: an item starts at the row the caller
// computes from the batch) or only some items, as a rank under Vision DP holds the items
// it encodes (train::load_pixels): then image_offsets[batch_index] is where the image's
// rows start, -1 for an image not held here; videos likewise.
struct PixelInputs {
  at::Tensor images;
  at::Tensor videos;  // undefined where the family takes no video or the batch has none
  std::vector<int64_t> image_offsets, video_offsets;

  // First row of `item` in images / videos; `whole_batch_row` is where it starts when the
  // whole batch is held. Throws when the item is not held here.
  int64_t first_row(const plan::VisionItem& item, int64_t whole_batch_row) const;
};

// The groups a step runs on: context (vision routing), ring and ulysses (attention).
struct StepGroups {
  dist::GroupPtr context, ring, ulysses;
};

// What the loss needs for plan.mine's slots: the final hidden states [L, hidden] and
// the LM head's weight [vocab, hidden] (the embedding when tied), so that the logits
// can be made a chunk at a time; the labels [L] and the global label count.
struct StepOutput {
  at::Tensor hidden, head_weight, labels;
  int64_t label_count = 0;
  at::Tensor logits() const;  // [L, vocab], all at once (tests, benchmarks)
};

class Vlm : public torch::nn::Module {
 public:
  // This rank's step: Vision DP encoding of its items, routing of the rows to their
  // placeholder slots in `mode`, splice, decoder on the shard.
  virtual StepOutput forward(const plan::Batch& batch, const plan::StepPlan& plan, const PixelInputs& pixels,
                             const StepGroups& groups, VisionMode mode,
                             const attention::AttentionOptions& attention = {}) const = 0;

  // The vision part alone: for this rank's placeholder slots, in arrival order
  // (routes.recv from rank 0 first), the rows that replace them [V, row width].
  virtual at::Tensor vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels,
                                 const StepGroups& groups, VisionMode mode) const = 0;

  // none: keep every activation; decoder: recompute decoder layers in the backward;
  // all: the vision tower's blocks too.
  void set_activation_checkpointing(ActivationCheckpointing mode);

  virtual const ModelConfig& config() const = 0;

  // The language decoder.
  virtual Decoder& decoder() const = 0;

  // The vision tower's blocks (hooked_blocks.h).
  virtual HookedBlocks& vision_blocks() const = 0;

  // The units --shard gradients|parameters gathers, frees and reduces one at a time
  // (layer_hooks.h): the decoder's (Decoder::hook_units), then the vision blocks.
  // set_layer_hooks gives the hooks to all of them.
  std::vector<HookUnit> hook_units() const;
  void set_layer_hooks(std::shared_ptr<LayerHooks> hooks);
};

}  // namespace mmsp::model
