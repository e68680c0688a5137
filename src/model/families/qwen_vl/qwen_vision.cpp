// The Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision encoders; see qwen_vision.h. Follows
// Hugging Face's Qwen2VisionTransformerPretrainedModel (rot_pos_emb, VisionAttention,
// PatchMerger), Qwen2_5_VisionTransformerPretrainedModel (get_window_index, RMSNorm,
// gated MLP) and Qwen3VLVisionModel (patch bias, interpolated position table, deepstack).
#include "mmsp/model/families/qwen_vl/qwen_vision.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "mmsp/attention/local_attention.h"
#include "mmsp/core/check.h"
#include "mmsp/model/families/qwen_vl/qwen_variant.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/families/qwen_vl/window_index.h"
#include "mmsp/model/layers/activation.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/model/layers/rotary.h"
#include "mmsp/model/phase_marker.h"

namespace mmsp::model {
QwenVisionEncoder::PatchEmbed::PatchEmbed(const QwenVisionConfig& c, bool bias) {
  auto proj = register_module("proj", std::make_shared<torch::nn::Module>());
  proj_weight = proj->register_parameter(
      "weight", normal_parameter({c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size},
                                 c.initializer_range));
  if (bias) proj_bias = proj->register_parameter("bias", zeros_parameter({c.hidden_size}));
}

QwenVisionEncoder::Norm::Norm(torch::nn::Module& parent, const std::string& name, int64_t dim, bool use_rms) {
  if (use_rms)
    rms = parent.register_module(name, std::make_shared<RMSNorm>(dim, 1e-6));
  else
    layer = parent.register_module(name, std::make_shared<LayerNorm>(dim, 1e-6));
}

at::Tensor QwenVisionEncoder::Norm::forward(const at::Tensor& x) const {
  return rms ? rms->forward(x) : layer->forward(x);
}

QwenVisionEncoder::Block::Block(const QwenVisionConfig& c, Variant variant) {
  const double s = c.initializer_range;
  const bool qwen3 = variant == Variant::qwen3, gated = variant == Variant::qwen2_5;
  norm1 = std::make_unique<Norm>(*this, "norm1", c.hidden_size, gated);
  norm2 = std::make_unique<Norm>(*this, "norm2", c.hidden_size, gated);
  attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", std::make_shared<Linear>(c.hidden_size, 3 * c.hidden_size, true, s));
  proj = attn->register_module("proj", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, s));
  mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  auto linear = [&](const char* name, int64_t in, int64_t out) {
    return mlp->register_module(name, std::make_shared<Linear>(in, out, true, s));
  };
  if (gated) {
    gate = linear("gate_proj", c.hidden_size, c.intermediate_size);
    up = linear("up_proj", c.hidden_size, c.intermediate_size);
    down = linear("down_proj", c.intermediate_size, c.hidden_size);
  } else {
    fc1 = linear(qwen3 ? "linear_fc1" : "fc1", c.hidden_size, c.intermediate_size);
    fc2 = linear(qwen3 ? "linear_fc2" : "fc2", c.intermediate_size, c.hidden_size);
  }
}

at::Tensor QwenVisionEncoder::Block::mlp_forward(const at::Tensor& x, const std::string& act) const {
  if (gate) return down->forward(activation(act, gate->forward(x)) * up->forward(x));
  return fc2->forward(activation(act, fc1->forward(x)));
}

QwenVisionEncoder::Merger::Merger(const QwenVisionConfig& c, Variant variant, bool postshuffle)
    : postshuffle_norm(postshuffle) {
  const int64_t width = c.hidden_size * c.spatial_merge_size * c.spatial_merge_size;
  const double s = c.initializer_range;
  const bool qwen3 = variant == Variant::qwen3;
  norm = std::make_unique<Norm>(*this, qwen3 ? "norm" : "ln_q", postshuffle ? width : c.hidden_size,
                                variant == Variant::qwen2_5);
  torch::nn::Module* parent = this;
  std::shared_ptr<torch::nn::Module> mlp;
  if (!qwen3) parent = (mlp = register_module("mlp", std::make_shared<torch::nn::Module>())).get();
  fc1 = parent->register_module(qwen3 ? "linear_fc1" : "0", std::make_shared<Linear>(width, width, true, s));
  fc2 =
      parent->register_module(qwen3 ? "linear_fc2" : "2", std::make_shared<Linear>(width, c.out_hidden_size, true, s));
}

at::Tensor QwenVisionEncoder::Merger::forward(const at::Tensor& x, int64_t merged_width) const {
  const int64_t rows = x.numel() / merged_width;  // not -1: no rows is a valid input
  at::Tensor merged = postshuffle_norm ? norm->forward(x.reshape({rows, merged_width}))
                                       : norm->forward(x).reshape({rows, merged_width});
  return fc2->forward(at::gelu(fc1->forward(merged)));
}

QwenVisionEncoder::QwenVisionEncoder(const QwenVisionConfig& c, QwenVariant variant)
    : config_(c), qwen3_(variant == QwenVariant::qwen3_vl) {
  variant_ = qwen3_ ? Variant::qwen3 : variant == QwenVariant::qwen2_5_vl ? Variant::qwen2_5 : Variant::qwen2;
  const int64_t unit = c.patch_size * c.spatial_merge_size;
  MMSP_CHECK(variant_ != Variant::qwen2_5 || (c.window_size >= unit && c.window_size % unit == 0),
             "vision_config.window_size ", c.window_size, " must be a positive multiple of patch_size * ",
             "spatial_merge_size = ", unit, " (a window of whole merged patches)");
  MMSP_CHECK(c.head_dim() % 4 == 0, "vision head size ", c.head_dim(),
             " must divide by 4 (2-D rotary: h and w halves)");
  patch_embed_ = register_module("patch_embed", std::make_shared<PatchEmbed>(c, qwen3_));
  if (qwen3_) {
    const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(double(c.num_position_embeddings))));
    MMSP_CHECK(c.num_position_embeddings > 0 && side * side == c.num_position_embeddings,
               "vision_config.num_position_embeddings (", c.num_position_embeddings,
               ") must be a square (a side × side position table)");
    pos_embed_ = register_module(
        "pos_embed", std::make_shared<Embedding>(c.num_position_embeddings, c.hidden_size, c.initializer_range));
  }
  blocks_ = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.depth; ++i) {
    block_list_.push_back(blocks_->register_module(std::to_string(i), std::make_shared<Block>(c, variant_)));
    hooked_blocks_.add(block_list_.back());
  }
  merger_ = register_module("merger", std::make_shared<Merger>(c, variant_, false));
  if (!c.deepstack_visual_indexes.empty()) {
    MMSP_CHECK(qwen3_, "deepstack_visual_indexes are a Qwen3-VL feature");
    auto list = register_module("deepstack_merger_list", std::make_shared<torch::nn::Module>());
    for (size_t k = 0; k < c.deepstack_visual_indexes.size(); ++k) {
      const int64_t index = c.deepstack_visual_indexes[k];
      MMSP_CHECK(index >= 0 && index < c.depth, "vision_config.deepstack_visual_indexes[", k, "] = ", index,
                 " is not a block (depth ", c.depth, ")");
      deepstack_.push_back(list->register_module(std::to_string(k), std::make_shared<Merger>(c, Variant::qwen3, true)));
    }
  }
}

at::Tensor vision_patch_positions(const std::vector<plan::Grid>& grids, int64_t m) {
  std::vector<at::Tensor> parts;
  for (const plan::Grid& g : grids) {
    // hpos/wpos [h, w] -> merge windows: (h/m, m, w/m, m) -> (h/m, w/m, m, m) -> flat
    at::Tensor hpos = at::arange(g[1], at::kLong).unsqueeze(1).expand({g[1], g[2]});
    at::Tensor wpos = at::arange(g[2], at::kLong).unsqueeze(0).expand({g[1], g[2]});
    auto windowed = [&](const at::Tensor& p) {
      return p.reshape({g[1] / m, m, g[2] / m, m}).permute({0, 2, 1, 3}).flatten();
    };
    parts.push_back(at::stack({windowed(hpos), windowed(wpos)}, -1).repeat({g[0], 1}));
  }
  return parts.empty() ? at::zeros({0, 2}, at::kLong) : at::cat(parts);
}

// Qwen3-VL: the side × side position table, bilinearly interpolated to an h × w grid
// (corners on a linspace, weights computed in fp32 as Hugging Face does), at the patches
// whose (h, w) are given (vision_patch_positions: merge-window order, frames repeated).
at::Tensor QwenVisionEncoder::interpolated_positions(const plan::Grid& g, const at::Tensor& hw) const {
  const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(double(config_.num_position_embeddings))));
  const at::Tensor& table = pos_embed_->weight;
  at::Tensor hs = at::linspace(0, double(side - 1), g[1], at::kFloat);
  at::Tensor ws = at::linspace(0, double(side - 1), g[2], at::kFloat);
  at::Tensor h0 = hs.to(at::kInt).to(at::kLong), w0 = ws.to(at::kInt).to(at::kLong);
  at::Tensor h1 = (h0 + 1).clamp_max(side - 1), w1 = (w0 + 1).clamp_max(side - 1);
  at::Tensor dh = hs - h0.to(at::kFloat), dw = ws - w0.to(at::kFloat);
  const at::Tensor h = hw.select(1, 0), w = hw.select(1, 1);  // per patch (host indices)
  const at::Tensor ph = dh.index_select(0, h), pw = dw.index_select(0, w);
  auto corner = [&](const at::Tensor& hi, const at::Tensor& wi, const at::Tensor& weight) {
    at::Tensor index = hi.index_select(0, h) * side + wi.index_select(0, w);
    return table.index_select(0, index.to(table.device())) *
           weight.to(table.device(), table.scalar_type()).unsqueeze(1);
  };
  return corner(h0, w0, (1 - ph) * (1 - pw)) + corner(h0, w1, (1 - ph) * pw) + corner(h1, w0, ph * (1 - pw)) +
         corner(h1, w1, ph * pw);  // [patches, hidden]
}

// The split items' patches as the exchange gathers them (rank by rank, each rank's
// shards in item order) put in the order one process attends them: item by item in the
// processor's order, a segment per frame (full blocks), or in Qwen2.5-VL's window order,
// a segment per window (windowed blocks). Built once per step, shared by every block.
QwenVisionEncoder::SplitAttention QwenVisionEncoder::split_attention(const SplitShards& s) const {
  const int S = s.ranks();
  const size_t n = s.grids.size();
  const int64_t m = config_.spatial_merge_size;
  SplitAttention out;
  out.exchange = s.exchange;
  out.tokens.assign(S, 0);
  std::vector<std::vector<int64_t>> base(S, std::vector<int64_t>(n, 0));  // gathered index of (rank, item)
  int64_t next = 0;
  for (int r = 0; r < S; ++r)
    for (size_t j = 0; j < n; ++j) {
      base[r][j] = next;
      next += s.patch_count(j, r);
      out.tokens[r] += s.patch_count(j, r);
    }
  auto gathered = [&](size_t j, int64_t patch) {
    const int64_t row = patch / s.patches_per_row[j];
    const auto& b = s.shard_rows[j];
    const int r = static_cast<int>(std::upper_bound(b.begin(), b.end(), row) - b.begin()) - 1;
    return base[r][j] + patch - s.first_patch(j, r);
  };
  std::vector<int64_t> perm, seg, ord;
  int64_t frame = 0;
  for (size_t j = 0; j < n; ++j) {
    const plan::Grid& g = s.grids[j];
    for (int64_t p = 0; p < g[0] * g[1] * g[2]; ++p) {
      perm.push_back(gathered(j, p));
      seg.push_back(frame + p / (g[1] * g[2]));
      ord.push_back(p % (g[1] * g[2]));
    }
    frame += g[0];
  }
  out.frames = GatheredOrder::make(perm, seg, ord);
  if (variant_ != Variant::qwen2_5) return out;
  perm.clear(), seg.clear(), ord.clear();
  int64_t window = 0;
  for (size_t j = 0; j < n; ++j) {
    const WindowIndex wi = window_index({s.grids[j]}, m, config_.window_size / (config_.patch_size * m));
    size_t k = 0;
    for (int64_t units : wi.window_units) {
      for (int64_t u = 0; u < units; ++u, ++k)
        for (int64_t q = 0; q < m * m; ++q) {
          perm.push_back(gathered(j, wi.order[k] * m * m + q));
          seg.push_back(window);
          ord.push_back(u * m * m + q);
        }
      ++window;
    }
  }
  out.windows = GatheredOrder::make(perm, seg, ord);
  return out;
}

at::Tensor QwenVisionEncoder::block_forward(const Block& b, const at::Tensor& x, const RotaryTable& rotary,
                                            const attention::TokenLayout& segments, const SplitAttention& split,
                                            bool full) const {
  const int64_t N = x.size(0), H = config_.num_heads, D = config_.head_dim();
  at::Tensor qkv = b.qkv->forward(b.norm1->forward(x)).view({N, 3, H, D});
  at::Tensor q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2);  // [N, H, D]
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  q = apply_rotary(q.to(wide), rotary).to(x.scalar_type());
  k = apply_rotary(k.to(wide), rotary).to(x.scalar_type());
  attention::AttentionOptions options;
  options.causal = false;                 // bidirectional; a segment (frame or window) keeps it inside
  const int64_t whole = segments.size();  // rows of whole items; this rank's shards follow
  at::Tensor attn = attention::local_attention(q.narrow(0, 0, whole), k.narrow(0, 0, whole), v.narrow(0, 0, whole),
                                               segments, segments, options);
  if (split.active()) {
    const GatheredOrder& order = full ? split.frames : split.windows;
    auto inner = [&order](const at::Tensor& gq, const at::Tensor& gk, const at::Tensor& gv) {
      return order.attend(gq, gk, gv);
    };
    const int64_t mine = N - whole;
    at::Tensor shards = split.exchange(q.narrow(0, whole, mine), k.narrow(0, whole, mine), v.narrow(0, whole, mine),
                                       split.tokens, inner);
    attn = at::cat({attn, shards});
  }
  at::Tensor h = x + b.proj->forward(attn.reshape({N, H * D}));
  return h + b.mlp_forward(b.norm2->forward(h), config_.hidden_act);
}

namespace {

// The whole items' patches as attention segments, one per frame, in the processor's order.
struct FrameLayout {
  int64_t patches = 0;
  attention::TokenLayout frames;
};

FrameLayout frame_layout(const std::vector<plan::Grid>& grids, int64_t m) {
  FrameLayout f;
  std::vector<int64_t> seg, ord;
  int64_t frame = 0;
  for (const plan::Grid& g : grids) {
    MMSP_CHECK(g[1] % m == 0 && g[2] % m == 0, "grid [", g[0], ", ", g[1], ", ", g[2],
               "] must divide by spatial_merge_size ", m);
    for (int64_t t = 0; t < g[0]; ++t, ++frame)
      for (int64_t i = 0; i < g[1] * g[2]; ++i) seg.push_back(frame), ord.push_back(i);
    f.patches += g[0] * g[1] * g[2];
  }
  f.frames = {at::tensor(at::ArrayRef<int64_t>(seg), at::kLong).clone(),
              at::tensor(at::ArrayRef<int64_t>(ord), at::kLong).clone()};
  return f;
}

// 2-D rotary: head_dim/4 frequencies for h, as many for w, then doubled.
struct VisionAngles {
  at::Tensor inv_freq;
  explicit VisionAngles(int64_t head_dim) {
    const int64_t quarter = head_dim / 4;
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    inv_freq = at::pow(10000.0, at::arange(0, 2 * quarter, 2, f64) / double(2 * quarter)).reciprocal();
  }
  at::Tensor operator()(const at::Tensor& hw) const {  // [N, 2] -> [N, head_dim]
    at::Tensor freqs = (hw.to(at::kDouble).unsqueeze(-1) * inv_freq).flatten(1);
    return at::cat({freqs, freqs}, -1);
  }
};

// Qwen2.5-VL's windows: the whole items' patches in window order, a segment per window;
// a window never leaves its frame, so the frames stay contiguous segments.
struct WindowOrder {
  at::Tensor order;    // merged units in window order
  at::Tensor restore;  // merged rows back to the processor's order
  attention::TokenLayout windows;
  int64_t m = 1;
  at::Tensor apply(const at::Tensor& t) const {  // [N, ...] in groups of m² rows per merged unit
    return t.view({-1, m * m, t.size(1)}).index_select(0, order.to(t.device())).view({t.size(0), t.size(1)});
  }
};

WindowOrder window_order(const std::vector<plan::Grid>& grids, int64_t m, int64_t window_units) {
  const WindowIndex wi = window_index(grids, m, window_units);
  WindowOrder w;
  w.m = m;
  w.order = at::tensor(at::ArrayRef<int64_t>(wi.order), at::kLong).clone();
  const std::vector<int64_t> inverse = wi.inverse();
  w.restore = at::tensor(at::ArrayRef<int64_t>(inverse), at::kLong).clone();
  const at::Tensor lengths = at::tensor(at::ArrayRef<int64_t>(wi.window_units), at::kLong) * (m * m);
  const at::Tensor window_of = at::arange(lengths.size(0), at::kLong).repeat_interleave(lengths);
  const at::Tensor starts = (lengths.cumsum(0) - lengths).repeat_interleave(lengths);
  w.windows = {window_of, at::arange(window_of.size(0), at::kLong) - starts};
  return w;
}

}  // namespace

at::Tensor QwenVisionEncoder::embed_patches(const at::Tensor& pixel_values, const std::vector<plan::Grid>& grids,
                                            const at::Tensor& whole_hw, const SplitShards& split,
                                            const std::vector<at::Tensor>& split_hw) const {
  const QwenVisionConfig& c = config_;
  // The Conv3d with stride = kernel is a matmul over flattened patches.
  const at::Tensor w = patch_embed_->proj_weight.reshape({c.hidden_size, c.patch_row()});
  at::Tensor x = patch_embed_->proj_bias.defined() ? at::linear(pixel_values, w, patch_embed_->proj_bias)
                                                   : at::linear(pixel_values, w);
  if (qwen3_ && pixel_values.size(0) > 0) {
    std::vector<at::Tensor> pos;
    int64_t first = 0;
    for (const plan::Grid& g : grids) {
      const int64_t n = g[0] * g[1] * g[2];
      pos.push_back(interpolated_positions(g, whole_hw.narrow(0, first, n)));
      first += n;
    }
    for (size_t j = 0; j < split.grids.size(); ++j) pos.push_back(interpolated_positions(split.grids[j], split_hw[j]));
    x = x + at::cat(pos);
  }
  return leave_phase_in_backward(x, Phase::vision);  // the encoder's backward ends here
}

VisionOutput QwenVisionEncoder::run_blocks(at::Tensor x, const RotaryTable& rotary,
                                           const attention::TokenLayout& frames, const attention::TokenLayout& windows,
                                           const SplitAttention& shared) const {
  const QwenVisionConfig& c = config_;
  VisionOutput out;
  const int64_t width = c.hidden_size * c.spatial_merge_size * c.spatial_merge_size;
  for (size_t i = 0; i < block_list_.size(); ++i) {
    const bool full =
        variant_ != Variant::qwen2_5 || std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(),
                                                  static_cast<int64_t>(i)) != c.fullatt_block_indexes.end();
    const attention::TokenLayout& segments = full ? frames : windows;
    std::shared_ptr<Block> block = block_list_[i];
    // By value: a recomputed block runs again after this frame (the encoder outlives the
    // step), its split items' exchanges with it, in the same order on every rank.
    x = hooked_blocks_.run(
        i,
        [this, block, rotary, segments, shared, full](const at::Tensor& in) {
          return block_forward(*block, in, rotary, segments, shared, full);
        },
        x);
    for (size_t k = 0; k < deepstack_.size(); ++k)
      if (c.deepstack_visual_indexes[k] == static_cast<int64_t>(i))
        out.deepstack.push_back(deepstack_[k]->forward(x, width));
  }
  out.rows = merger_->forward(x, width);
  return out;
}

VisionOutput QwenVisionEncoder::forward(const at::Tensor& pixel_values, const std::vector<plan::Grid>& grids,
                                        const SplitShards& split) const {
  const QwenVisionConfig& c = config_;
  const int64_t m = c.spatial_merge_size;
  const FrameLayout layout = frame_layout(grids, m);
  const int64_t patches = layout.patches, patch_dim = c.patch_row();
  MMSP_CHECK(pixel_values.dim() == 2 && pixel_values.size(0) == patches + split.pixel_rows &&
                 pixel_values.size(1) == patch_dim,
             "pixel_values ", pixel_values.sizes(), " must be [", patches + split.pixel_rows, ", ", patch_dim,
             "] for these grids (C·tp·p·p = ", patch_dim, ")");
  // The split items' patches this rank encodes (vision-tower SP): their (h, w), for the
  // rotary angles and Qwen3-VL's position table.
  std::vector<at::Tensor> split_hw;
  for (size_t j = 0; j < split.grids.size(); ++j)
    split_hw.push_back(vision_patch_positions({split.grids[j]}, m)
                           .narrow(0, split.first_patch(j, split.rank), split.patch_count(j, split.rank)));
  const at::Tensor whole_hw = vision_patch_positions(grids, m);  // [patches, 2]
  at::Tensor x = embed_patches(pixel_values, grids, whole_hw, split, split_hw);
  const VisionAngles angles(c.head_dim());
  at::Tensor emb = angles(whole_hw);  // the whole items'
  // Qwen2.5-VL: the whole items' patches (and their rotary angles) in window order. A
  // split item's patches stay in the processor's order here: its attention puts the
  // gathered item in window order (split_attention).
  attention::TokenLayout windows = layout.frames;  // no rows: nothing to put in window order
  at::Tensor restore;
  if (variant_ == Variant::qwen2_5 && patches > 0) {
    const WindowOrder wo = window_order(grids, m, c.window_size / (c.patch_size * m));
    x = split.empty() ? wo.apply(x)
                      : at::cat({wo.apply(x.narrow(0, 0, patches)), x.narrow(0, patches, split.pixel_rows)});
    emb = wo.apply(emb);
    windows = wo.windows;
    restore = wo.restore;
  }
  if (!split.empty()) {
    std::vector<at::Tensor> parts{emb};
    for (const at::Tensor& hw : split_hw) parts.push_back(angles(hw));
    emb = at::cat(parts);
  }
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const RotaryTable rotary{emb.cos().to(wide).to(x.device()), emb.sin().to(wide).to(x.device())};
  const SplitAttention shared = split.empty() ? SplitAttention{} : split_attention(split);
  VisionOutput out = run_blocks(x, rotary, layout.frames, windows, shared);
  if (restore.defined()) {
    const at::Tensor whole_rows = out.rows.narrow(0, 0, patches / (m * m));
    out.rows = at::cat({whole_rows.index_select(0, restore.to(out.rows.device())),
                        out.rows.narrow(0, whole_rows.size(0), out.rows.size(0) - whole_rows.size(0))});
  }
  return out;
}

TowerInput QwenVisionEncoder::gather(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels) const {
  TowerInput input;
  std::vector<at::Tensor> rows;
  for (const plan::VisionItem& item : items) {
    const at::Tensor& source = item.kind == plan::VisionKind::image ? pixels.images : pixels.videos;
    const int64_t first = pixels.first_row(item, item.patch_offset);
    MMSP_CHECK(source.defined() && source.size(0) >= first + item.patches, "pixel rows of ", plan::to_string(item.kind),
               " ", item.batch_index, " (rows ", first, "..", first + item.patches, ") are missing: got ",
               source.defined() ? source.size(0) : 0, " rows");
    rows.push_back(source.narrow(0, first, item.patches));
    input.grids.push_back(item.grid);
  }
  input.pixels = at::cat(rows);
  return input;
}

void QwenVisionEncoder::add_split(const std::vector<plan::VisionItem>& items, const PixelInputs& pixels,
                                  const SplitEncoding& split, TowerInput& input) const {
  SplitShards& s = input.split = SplitShards(split);
  std::vector<at::Tensor> rows{input.pixels};
  for (const plan::VisionItem& item : items) {
    MMSP_ASSERT(item.split() && item.rows > 0 && item.patches % item.rows == 0);
    s.add(item, item.patches / item.rows);
    const size_t j = s.grids.size() - 1;
    const int64_t first = s.first_patch(j, s.rank), count = s.patch_count(j, s.rank);
    const at::Tensor& source = item.kind == plan::VisionKind::image ? pixels.images : pixels.videos;
    const int64_t at_row = pixels.row_of(item, item.patch_offset, first, count);
    MMSP_CHECK(source.defined() && source.size(0) >= at_row + count, "pixel rows of ", plan::to_string(item.kind), " ",
               item.batch_index, " (rows ", at_row, "..", at_row + count, " of its shard) are missing: got ",
               source.defined() ? source.size(0) : 0, " rows");
    rows.push_back(source.narrow(0, at_row, count).to(input.pixels.scalar_type()));
    s.pixel_rows += count;
  }
  input.pixels = at::cat(rows);
}

TowerInput QwenVisionEncoder::no_items(const at::TensorOptions& options) const {
  return {at::zeros({0, config_.patch_row()}, options), {}};
}

at::Tensor QwenVisionEncoder::encode(const TowerInput& input) const {
  VisionOutput out = forward(input.pixels, input.grids, input.split);
  if (out.deepstack.empty()) return out.rows;
  // One row per placeholder: the merger's features, then each deepstack level's, so
  // one message carries them all along the same route.
  out.deepstack.insert(out.deepstack.begin(), out.rows);
  return at::cat(out.deepstack, 1);
}

}  // namespace mmsp::model
