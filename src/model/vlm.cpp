// The one VLM step; see vlm.h. Where rows go is read off the plan's routes (through the
// router): nothing here searches token ids or sees a process group.
#include "mmsp/model/vlm.h"

#include <ATen/ATen.h>

#include <unordered_set>

#include "mmsp/core/check.h"
#include "mmsp/model/hooks/activation_offload.h"
#include "mmsp/model/phase_marker.h"

namespace mmsp::model {
namespace {

// Whether a parameter outside the decoder (the tower, its merger or projector) trains: then
// the rows the encoding ranks send carry a gradient, and a rank with no items must take part
// in the routing's backward too. A frozen tower's routing (--freeze) has no backward on any rank.
bool vision_trains(const Vlm& vlm) {
  std::unordered_set<const void*> decoder;
  for (const at::Tensor& p : vlm.decoder().parameters()) decoder.insert(p.unsafeGetTensorImpl());
  for (const at::Tensor& p : vlm.parameters())
    if (p.requires_grad() && !decoder.count(p.unsafeGetTensorImpl())) return true;
  return false;
}

}  // namespace

at::Tensor StepOutput::logits() const { return at::linear(hidden, head_weight); }

Vlm::Vlm(ModelConfig config, std::shared_ptr<Decoder> decoder, std::shared_ptr<VisionTower> tower, VlmRules rules)
    : config_(std::move(config)), decoder_(std::move(decoder)), tower_(std::move(tower)), rules_(rules) {
  MMSP_CHECK(decoder_ && tower_, "a Vlm needs a decoder and a vision tower");
  MMSP_CHECK(tower_->row_width() == config_.text.hidden_size * (1 + tower_->deepstack_levels()),
             "the vision tower's rows are ", tower_->row_width(), " wide, but the decoder's hidden_size ",
             config_.text.hidden_size, " × (1 + ", tower_->deepstack_levels(), " deepstack levels) is ",
             config_.text.hidden_size * (1 + tower_->deepstack_levels()));
}

void Vlm::check(const RankInputs& in) const {
  if (rules_.positions_within_max)
    MMSP_CHECK(in.longest_sequence <= config_.text.max_position_embeddings, "a sequence of ", in.longest_sequence,
               " tokens is longer than text_config.max_position_embeddings (", config_.text.max_position_embeddings,
               "), beyond which ", config_.model_type, "'s RoPE changes; shorten it");
}

at::Tensor Vlm::encode(const std::vector<plan::VisionItem>& items, const std::vector<int64_t>& which,
                       const SplitEncoding& split, const PixelInputs& pixels) const {
  const at::TensorOptions options = decoder_->model->embed_tokens->weight.options();
  if (which.empty() && split.empty() && !tower_->blocks().hooked())
    return at::zeros({0, tower_->row_width()}, options).requires_grad_(vision_trains(*this));
  PhaseScope vision(Phase::vision);
  TowerInput input;
  if (which.empty()) {
    // Hooked blocks (--shard gradients|parameters) gather, free and reduce with
    // collectives: this rank runs them on no rows, calling their hooks as the others do.
    input = tower_->no_items(options);
  } else {
    std::vector<plan::VisionItem> mine;
    for (int64_t i : which) mine.push_back(items.at(i));
    input = tower_->gather(mine, pixels);
  }
  if (!split.empty()) {
    std::vector<plan::VisionItem> shared;
    for (int64_t i : split.items) shared.push_back(items.at(i));
    tower_->add_split(shared, pixels, split, input);
  }
  return enter_phase_in_backward(tower_->encode(input), Phase::vision);
}

at::Tensor Vlm::vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels, const VisionRouter& route) const {
  tower_->check(plan, pixels);
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  return route([&](const std::vector<int64_t>& which, const SplitEncoding& split) {
           return encode(items, which, split, pixels);
         })
      .rows;
}

StepOutput Vlm::forward(const RankInputs& in, const plan::StepPlan& plan, const PixelInputs& pixels,
                        const StepParallelism& parallelism) const {
  MMSP_CHECK(parallelism.plan_attention && parallelism.route_vision, "the step needs its attention and vision router");
  MMSP_CHECK(!config_.text.moe.any() || parallelism.sum_over_batch,
             "a mixture-of-experts step needs the sum over the batch's ranks of its routing counts");
  check(in);
  tower_->check(plan, pixels);
  // The plan's tensors are made on the host; they meet the activations on the model's device.
  const at::Device device = decoder_->model->embed_tokens->weight.device();
  at::Tensor embeds = decoder_->embed(in.token_ids.to(device));  // [L, hidden]
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  const RoutedRows routed =
      parallelism.route_vision([&](const std::vector<int64_t>& which, const SplitEncoding& split) {
        return encode(items, which, split, pixels);
      });
  const int64_t hidden = config_.text.hidden_size;
  const at::Tensor rows = routed.rows.to(embeds.scalar_type());  // [V, hidden · (1 + levels)]
  const at::Tensor slots = routed.slots.to(device);
  embeds = embeds.index_copy(0, slots, rows.narrow(1, 0, hidden));

  DecoderContext ctx = decoder_context(in, config_.text, config_.conventions, parallelism.plan_attention(), embeds);
  ctx.visual_slots = slots;
  for (int k = 0; k < tower_->deepstack_levels(); ++k)
    ctx.deepstack.push_back(rows.narrow(1, (k + 1) * hidden, hidden));
  const MoeConfig& moe = config_.text.moe;
  if (moe.any()) {
    ctx.moe.exchange = parallelism.experts;
    ctx.moe.real = in.real.to(device);
    ctx.moe.load = std::make_shared<RouterLoad>(
        moe.num_experts, sparse_layer_count(config_.text),
        moe.aux_loss() ? moe.router_aux_loss_coef * parallelism.aux_loss_scale : 0.0, in.real.numel());
  }
  StepOutput out{decoder_->final_hidden(embeds, ctx), decoder_->head_weight(), in.labels.to(device), in.label_count};
  if (ctx.moe.load) {
    out.aux_loss = ctx.moe.load->finish(parallelism.sum_over_batch);
    out.expert_counts = ctx.moe.load->counts();
  }
  return out;
}

void Vlm::set_activation_checkpointing(ActivationCheckpointing mode, bool offload_inputs) {
  MMSP_CHECK(!offload_inputs || mode != ActivationCheckpointing::none,
             "--offload-activations keeps the inputs of recomputed layers in host memory: it needs "
             "--checkpoint-activations decoder or all, not none");
  // One store for the decoder and the tower: its prefetch follows the backward's order.
  const auto offload = offload_inputs ? std::make_shared<ActivationOffload>() : nullptr;
  decoder().set_recompute_layers(mode != ActivationCheckpointing::none, offload);
  vision_blocks().set_recompute(mode == ActivationCheckpointing::all, offload);
}

std::vector<HookUnit> Vlm::hook_units() const {
  std::vector<HookUnit> units = decoder().hook_units();
  for (HookUnit& block : vision_blocks().units()) units.push_back(std::move(block));
  return units;
}

void Vlm::set_layer_hooks(std::shared_ptr<LayerHooks> hooks) {
  vision_blocks().set_hooks(hooks, decoder().hook_units().size());
  decoder().set_layer_hooks(std::move(hooks));
}

}  // namespace mmsp::model
