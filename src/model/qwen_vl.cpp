// Qwen2-VL step: Vision DP, routing, splice, decoder; see qwen_vl.h. Where rows go
// is read off the plan's routes: nothing here searches token ids.
#include "mmsp/model/qwen_vl.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/all_to_all_v.h"
#include "mmsp/model/rank_inputs.h"

namespace mmsp::model {
namespace {

at::Tensor index_tensor(const std::vector<int64_t>& values) {
  return at::tensor(at::ArrayRef<int64_t>(values), at::kLong).clone();
}

}  // namespace

VisionMode parse_vision_mode(const std::string& name) {
  if (name == "routed") return VisionMode::routed;
  if (name == "gather") return VisionMode::gather;
  if (name == "replicate") return VisionMode::replicate;
  MMSP_CHECK(false, "vision mode '", name, "' must be routed, gather or replicate");
  return VisionMode::routed;
}

const char* to_string(VisionMode mode) {
  switch (mode) {
    case VisionMode::routed: return "routed";
    case VisionMode::gather: return "gather";
    case VisionMode::replicate: return "replicate";
  }
  return "?";
}

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
  if (which.empty()) {
    // A rank that encodes nothing still takes part in the routing collective's
    // backward, so its (empty) rows must be in the graph.
    const at::Tensor& w = decoder_->model->embed_tokens->weight;
    return at::zeros({0, row_width_}, w.options()).requires_grad_();
  }
  std::vector<at::Tensor> rows;
  std::vector<plan::Grid> grids;
  for (int64_t i : which) {
    const plan::VisionItem& item = items.at(i);
    const at::Tensor& source = item.kind == plan::VisionKind::image ? pixels.images : pixels.videos;
    MMSP_CHECK(source.defined() && source.size(0) >= item.patch_offset + item.patches,
               "pixel rows of ", plan::to_string(item.kind), " ", item.batch_index, " (rows ",
               item.patch_offset, "..", item.patch_offset + item.patches, ") are missing: got ",
               source.defined() ? source.size(0) : 0, " rows");
    rows.push_back(source.narrow(0, item.patch_offset, item.patches));
    grids.push_back(item.grid);
  }
  // One row per placeholder: the merger's features, then each deepstack level's, so
  // one message carries them all along the same route.
  VisionOutput out = visual_->forward(at::cat(rows), grids);
  if (out.deepstack.empty()) return out.rows;
  out.deepstack.insert(out.deepstack.begin(), out.rows);
  return at::cat(out.deepstack, 1);
}

at::Tensor QwenVLModel::vision_rows(const plan::StepPlan& plan, const PixelInputs& pixels,
                                    const StepGroups& groups, VisionMode mode) const {
  const plan::RankRoutes& routes = plan.mine.routes;
  const std::vector<plan::VisionItem>& items = plan.rows.at(plan.mine.coords.dp).items;
  const int S = groups.context->size();
  // Position of each needed row among the rows this rank ends up holding.
  std::vector<int64_t> pick;
  if (mode == VisionMode::routed) {
    at::Tensor mine = encode(items, routes.encoder_items, pixels);
    std::vector<int64_t> send_rows, send_counts(S), recv_counts(S);
    for (int dst = 0; dst < S; ++dst) {
      send_counts[dst] = static_cast<int64_t>(routes.send[dst].size());
      for (const plan::RouteRow& r : routes.send[dst]) send_rows.push_back(r.src_row);
    }
    for (int src = 0; src < S; ++src) recv_counts[src] = static_cast<int64_t>(routes.recv[src].size());
    return dist::all_to_all_v(mine.index_select(0, index_tensor(send_rows)), send_counts, recv_counts,
                              groups.context);
  }
  if (mode == VisionMode::gather) {
    at::Tensor mine = encode(items, routes.encoder_items, pixels);
    std::vector<int64_t> counts(S, 0), offset(S, 0);
    for (const plan::VisionItem& item : items) counts.at(item.encoder_rank) += item.rows;
    for (int r = 1; r < S; ++r) offset[r] = offset[r - 1] + counts[r - 1];
    at::Tensor all = dist::all_gather_v(mine, counts, groups.context);
    for (int src = 0; src < S; ++src)
      for (const plan::RouteRow& r : routes.recv[src]) pick.push_back(offset[src] + r.src_row);
    return all.index_select(0, index_tensor(pick));
  }
  // replicate: every item of the row, in item order
  std::vector<int64_t> every(items.size()), first_row(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    every[i] = static_cast<int64_t>(i);
    if (i > 0) first_row[i] = first_row[i - 1] + items[i - 1].rows;
  }
  at::Tensor all = encode(items, every, pixels);
  for (int src = 0; src < S; ++src)
    for (const plan::RouteRow& r : routes.recv[src]) pick.push_back(first_row.at(r.item) + r.row);
  return all.index_select(0, index_tensor(pick));
}

QwenVLModel::StepOutput QwenVLModel::forward(const plan::Batch& batch, const plan::StepPlan& plan,
                                             const PixelInputs& pixels, const StepGroups& groups,
                                             VisionMode mode,
                                             const attention::AttentionOptions& attention) const {
  const plan::RankRoutes& routes = plan.mine.routes;
  MMSP_CHECK(groups.context->size() == plan.options.mesh.context(), "the plan's context group has ",
             plan.options.mesh.context(), " ranks but the step runs on ", groups.context->size());
  RankInputs in = rank_inputs(batch, plan);
  at::Tensor embeds = decoder_->embed(in.token_ids);  // [L, hidden]
  // Received rows arrive in slot order per source rank; their slots, in that order:
  std::vector<int64_t> slots;
  for (const auto& from : routes.recv)
    for (const plan::RouteRow& r : from) slots.push_back(r.slot);
  const at::Tensor slot_index = index_tensor(slots);
  const int64_t hidden = config_.text.hidden_size;
  at::Tensor rows = vision_rows(plan, pixels, groups, mode).to(embeds.scalar_type());
  embeds = embeds.index_copy(0, slot_index, rows.narrow(1, 0, hidden));

  DecoderContext ctx;
  ctx.visual_slots = slot_index;
  for (int k = 0; k < visual_->deepstack_levels(); ++k)
    ctx.deepstack.push_back(rows.narrow(1, (k + 1) * hidden, hidden));
  ctx.groups = {groups.ring, groups.ulysses};
  ctx.ring_shares = in.ring_shares;
  ctx.rotary = rotary_table(in.positions, rotary_options(config_.text, config_.conventions),
                            embeds.scalar_type(), embeds.device());
  ctx.attention = attention;
  return {decoder_->forward(embeds, ctx), in.labels, in.label_count};
}

}  // namespace mmsp::model
