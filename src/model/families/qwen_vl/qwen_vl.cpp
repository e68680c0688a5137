// Qwen-VL step: Vision DP, routing, splice, decoder; see qwen_vl.h. Where rows go
// is read off the plan's routes: nothing here searches token ids.
#include "mmsp/model/families/qwen_vl/qwen_vl.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/model/phase_marker.h"
#include "mmsp/model/rank_inputs.h"

namespace mmsp::model {
QwenVLModel::QwenVLModel(const ModelConfig& config) : config_(config) {
  MMSP_CHECK(config.qwen_vision.has_value(), "model_type ", config.model_type,
             " has no Qwen vision encoder (QwenVLModel serves qwen2_vl and qwen3_vl)");
  visual_ = std::make_shared<QwenVisionEncoder>(*config.qwen_vision, config.family);
  decoder_ = std::make_shared<Decoder>(config.text, config.tie_word_embeddings);
  if (config.family == plan::ModelFamily::qwen3_vl) {
    // model.visual.*, model.language_model.*, lm_head.*
    auto model = register_module("model", std::make_shared<torch::nn::Module>());
    model->register_module("visual", visual_);
    model->register_module("language_model", decoder_->model);
  } else {
    // visual.*, model.*, lm_head.*
    register_module("visual", visual_);
    register_module("model", decoder_->model);
  }
  if (decoder_->lm_head) register_module("lm_head", decoder_->lm_head);
  row_width_ = config.text.hidden_size * (1 + visual_->deepstack_levels());
}

at::Tensor QwenVLModel::encode(const std::vector<plan::VisionItem>& items,
                               const std::vector<int64_t>& which, const PixelInputs& pixels) const {
  if (which.empty() && !visual_->blocks().hooked()) {
    // A rank that encodes nothing still takes part in the routing collective's
    // backward, so its (empty) rows must be in the graph.
    const at::Tensor& w = decoder_->model->embed_tokens->weight;
    return at::zeros({0, row_width_}, w.options()).requires_grad_();
  }
  PhaseScope vision(Phase::vision);
  std::vector<at::Tensor> rows;
  std::vector<plan::Grid> grids;
  if (which.empty()) {
    // Hooked blocks (--shard gradients|parameters) gather, free and reduce with
    // collectives: this rank runs them on no rows, calling their hooks as the others do.
    const at::Tensor& w = decoder_->model->embed_tokens->weight;
    rows.push_back(at::zeros({0, visual_->config().patch_row()}, w.options()));
  }
  for (int64_t i : which) {
    const plan::VisionItem& item = items.at(i);
    const at::Tensor& source = item.kind == plan::VisionKind::image ? pixels.images : pixels.videos;
    const int64_t first = pixels.first_row(item, item.patch_offset);
    MMSP_CHECK(source.defined() && source.size(0) >= first + item.patches,
               "pixel rows of ", plan::to_string(item.kind), " ", item.batch_index, " (rows ",
               first, "..", first + item.patches, ") are missing: got ",
               source.defined() ? source.size(0) : 0, " rows");
    rows.push_back(source.narrow(0, first, item.patches));
    grids.push_back(item.grid);
  }
  // One row per placeholder: the merger's features, then each deepstack level's, so
  // one message carries them all along the same route.
  VisionOutput out = visual_->forward(at::cat(rows), grids);
  if (out.deepstack.empty()) return enter_phase_in_backward(out.rows, Phase::vision);
  out.deepstack.insert(out.deepstack.begin(), out.rows);
  return enter_phase_in_backward(at::cat(out.deepstack, 1), Phase::vision);
}

at::Tensor QwenVLModel::vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels,
                                    const StepGroups& groups, VisionMode mode) const {
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  return route_vision_rows(plan, [&](const std::vector<int64_t>& which) { return encode(items, which, pixels); },
                           groups.context, mode)
      .rows;
}

StepOutput QwenVLModel::forward(const plan::Batch& batch, const plan::StepPlan& plan,
                                             const PixelInputs& pixels, const StepGroups& groups,
                                             VisionMode mode,
                                             const attention::AttentionOptions& attention) const {
  RankInputs in = rank_inputs(batch, plan);
  at::Tensor embeds = decoder_->embed(in.token_ids);  // [L, hidden]
  const auto& items = plan.rows.at(plan.mine.coords.dp).items;
  RoutedRows routed = route_vision_rows(
      plan, [&](const std::vector<int64_t>& which) { return encode(items, which, pixels); },
      groups.context, mode);
  const at::Tensor& slot_index = routed.slots;
  const int64_t hidden = config_.text.hidden_size;
  at::Tensor rows = routed.rows.to(embeds.scalar_type());
  embeds = embeds.index_copy(0, slot_index, rows.narrow(1, 0, hidden));

  DecoderContext ctx = decoder_context(in, config_.text, config_.conventions,
                                       {groups.ring, groups.ulysses}, attention, embeds);
  ctx.visual_slots = slot_index;
  for (int k = 0; k < visual_->deepstack_levels(); ++k)
    ctx.deepstack.push_back(rows.narrow(1, (k + 1) * hidden, hidden));
  return {decoder_->final_hidden(embeds, ctx), decoder_->head_weight(), in.labels, in.label_count};
}

}  // namespace mmsp::model
