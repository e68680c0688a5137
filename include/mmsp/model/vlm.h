// The vision-language model every family builds: a decoder and a vision tower
// (vision_tower.h), joined by the one copy of the step. The step never sees a process
// group: the decoder's attention (planned once per step from this rank's shares) and the
// router of the vision rows come in from outside as StepParallelism (made by
// parallel/step_parallelism.h for the trainer, the benchmarks and the tests). A family is built by
// its registry entry (family.h), which names the parameters as its checkpoints do
// (torch::nn::Module's named_parameters()); the trainer never asks which family it is.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mmsp/attention/step_attention.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/hooks/hooked_blocks.h"
#include "mmsp/model/hooks/recompute.h"
#include "mmsp/model/layers/decoder.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/model/vision/pixel_inputs.h"
#include "mmsp/model/vision/routed_rows.h"
#include "mmsp/model/vision/vision_tower.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::model {

// How this rank's step is spread over the mesh, made outside the model once per step.
struct StepParallelism {
  // The decoder's attention (every layer's), planned when the decoder is about to run:
  // after the vision part, so that its masks do not add to the vision phase's peak.
  std::function<std::shared_ptr<const attention::StepAttention>()> plan_attention;
  VisionRouter route_vision;  // Vision DP encoding and routing
  // Mixture-of-experts decoders: how each sparse layer's tokens reach their experts (unset:
  // every expert here), and the sum over every rank of the step's batch, in place, of the
  // routing counts (once, after the decoder; required for such a decoder).
  ExpertExchange experts;
  std::function<void(at::Tensor&)> sum_over_batch;
  // This forward's share of the step's auxiliary loss: 1/K for each of --accumulate's K
  // micro-batches (the step's aux loss is their mean, as Megatron and VeOmni take it: each
  // micro-batch's routing is only known in its own forward).
  double aux_loss_scale = 1;
};

// What the loss needs for plan.mine's slots: the final hidden states [L, hidden] and
// the LM head's weight [vocab, hidden] (the embedding when tied), so that the logits
// can be made a chunk at a time; the labels [L] and the global label count.
struct StepOutput {
  at::Tensor hidden, head_weight, labels;
  int64_t label_count = 0;
  at::Tensor logits() const;  // [L, vocab], all at once (tests, benchmarks)
  // Mixture-of-experts decoders (router_load.h): this rank's share of router_aux_loss_coef
  // times the auxiliary loss (a value: its gradient enters through the layers), to add
  // to the loss; and [sparse layers, E] the step's picks of each expert, every rank's.
  double aux_loss = 0;
  at::Tensor expert_counts;
};

// Rules a family adds to the step.
struct VlmRules {
  // Refuse sequences longer than text max_position_embeddings (InternVL: transformers'
  // "dynamic" RoPE changes its frequencies beyond it).
  bool positions_within_max = false;
};

class Vlm : public torch::nn::Module {
 public:
  // Registers nothing: the family names the tower's and the decoder's modules as its
  // checkpoints do (register_module), in the order it built them.
  Vlm(ModelConfig config, std::shared_ptr<Decoder> decoder, std::shared_ptr<VisionTower> tower, VlmRules rules = {});

  // This rank's step: embed its tokens; the tower encodes the items the router gives this
  // rank and the router brings each placeholder slot its row; splice; the decoder on the
  // shard (Qwen3-VL's deepstack rows added after its first layers). Every check runs
  // before the first collective, alike on every rank.
  StepOutput forward(const RankInputs& inputs, const plan::StepPlan& plan, const PixelInputs& pixels,
                     const StepParallelism& parallelism) const;

  // The vision part alone: for this rank's placeholder slots, in arrival order
  // (routes.recv from rank 0 first), the rows that replace them [V, row width].
  at::Tensor vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels, const VisionRouter& route) const;

  // none: keep every activation; decoder: recompute decoder layers in the backward;
  // all: the vision tower's blocks too. `offload_inputs`: the recomputed layers' and
  // blocks' inputs wait in host memory for the backward (--offload-activations).
  void set_activation_checkpointing(ActivationCheckpointing mode, bool offload_inputs = false);
  // The decoder's MLPs over tiles of tokens (--tiled-mlp; tiled_mlp.h).
  void set_mlp_tile(int64_t setting) { decoder_->set_mlp_tile(setting); }

  const ModelConfig& config() const { return config_; }
  Decoder& decoder() const { return *decoder_; }
  VisionTower& tower() const { return *tower_; }
  HookedBlocks& vision_blocks() const { return tower_->blocks(); }

  // The units --shard gradients|parameters gathers, frees and reduces one at a time
  // (layer_hooks.h): the decoder's (Decoder::hook_units), then the vision blocks.
  // set_layer_hooks gives the hooks to all of them.
  std::vector<HookUnit> hook_units() const;
  void set_layer_hooks(std::shared_ptr<LayerHooks> hooks);

 private:
  // The rows of items `which` of this dp row and of this rank's shards of the split ones
  // (the router's EncodeItems). No items: rows [0, width] still in the graph (the rank
  // takes part in the routing's backward) and, with hooked blocks, run through them on the
  // tower's empty input.
  at::Tensor encode(const std::vector<plan::VisionItem>& items, const std::vector<int64_t>& which,
                    const SplitEncoding& split, const PixelInputs& pixels) const;
  void check(const RankInputs& inputs) const;

  ModelConfig config_;
  std::shared_ptr<Decoder> decoder_;
  std::shared_ptr<VisionTower> tower_;
  VlmRules rules_;
};

}  // namespace mmsp::model
