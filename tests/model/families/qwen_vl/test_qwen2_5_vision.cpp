// Qwen2.5-VL's vision tower on one process against transformers' formulas written out
// here (Qwen2_5_VisionTransformerPretrainedModel: get_window_index with its -100
// padding, the vision rotary in window order, RMSNorm, the gated SiLU MLP, attention
// per cu_seqlens chunk, the merger, argsort back): the window index and its inverse,
// the windowed block against the full-attention block, and the tower's rows and every
// parameter gradient in fp64. Bad window sizes are refused when the config is read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/families/qwen_vl/qwen_vision.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"
#include "mmsp/model/families/qwen_vl/window_index.h"

using namespace mmsp;
using at::Tensor;

namespace {

// Width 16 (2 heads of 8), patches of 2 px merged 2 × 2, windows of 8 px = 2 merged
// patches per side; block 1 attends over whole frames.
nlohmann::json tiny_qwen2_5_json() {
  return {{"model_type", "qwen2_5_vl"},
          {"vocab_size", 128},
          {"hidden_size", 96},
          {"intermediate_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 12},
          {"num_key_value_heads", 2},
          {"rope_theta", 10000.0},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false},
          {"vision_start_token_id", 120},
          {"vision_end_token_id", 121},
          {"image_token_id", 122},
          {"video_token_id", 123},
          {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}}},
          {"vision_config",
           {{"depth", 2},
            {"hidden_size", 16},
            {"intermediate_size", 24},
            {"num_heads", 2},
            {"out_hidden_size", 96},
            {"patch_size", 2},
            {"spatial_merge_size", 2},
            {"temporal_patch_size", 2},
            {"in_chans", 3},
            {"hidden_act", "silu"},
            {"window_size", 8},
            {"fullatt_block_indexes", {1}},
            {"tokens_per_second", 2}}}};
}

model::QwenVisionConfig vision_of(const nlohmann::json& j) {
  return *model::qwen_vision_of(model::parse_model_config(j, "tiny qwen2_5_vl"));
}

// transformers' get_window_index, tensor for tensor.
std::pair<Tensor, std::vector<int64_t>> reference_window_index(const std::vector<plan::Grid>& grids, int64_t m,
                                                               int64_t window_size, int64_t patch) {
  std::vector<Tensor> index;
  std::vector<int64_t> cu{0};
  int64_t id = 0;
  const int64_t ws = window_size / m / patch;
  for (const plan::Grid& g : grids) {
    const int64_t lh = g[1] / m, lw = g[2] / m;
    Tensor idx = at::arange(g[0] * lh * lw, at::kLong).reshape({g[0], lh, lw});
    const int64_t pad_h = ws - lh % ws, pad_w = ws - lw % ws;
    const int64_t nh = (lh + pad_h) / ws, nw = (lw + pad_w) / ws;
    Tensor padded = at::constant_pad_nd(idx, {0, pad_w, 0, pad_h}, -100);
    padded = padded.reshape({g[0], nh, ws, nw, ws}).permute({0, 1, 3, 2, 4}).reshape({g[0], nh * nw, ws, ws});
    const Tensor seqlens = padded.ne(-100).sum({2, 3}).reshape({-1});
    padded = padded.reshape({-1});
    index.push_back(padded.masked_select(padded.ne(-100)) + id);
    const Tensor cum = seqlens.cumsum(0) * (m * m) + cu.back();
    for (int64_t k = 0; k < cum.size(0); ++k) cu.push_back(cum[k].item<int64_t>());
    id += g[0] * lh * lw;
  }
  std::vector<int64_t> unique{cu[0]};  // torch.unique_consecutive
  for (int64_t v : cu)
    if (v != unique.back()) unique.push_back(v);
  return {at::cat(index), unique};
}

Tensor rotate_half(const Tensor& x) {
  const int64_t d = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, d, d), x.narrow(-1, 0, d)}, -1);
}

Tensor rms_norm(const Tensor& x, const Tensor& w) { return w * (x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6)); }

// Qwen2_5_VisionTransformerPretrainedModel.forward with the weights of `p`.
Tensor reference_tower(const std::map<std::string, Tensor>& p, const model::QwenVisionConfig& c, const Tensor& pixels,
                       const std::vector<plan::Grid>& grids) {
  const int64_t m = c.spatial_merge_size, unit = m * m, D = c.hidden_size, H = c.num_heads, hd = D / H;
  Tensor x = at::linear(pixels, p.at("patch_embed.proj.weight").reshape({D, -1}));
  // rot_pos_emb: (h, w) of each patch in merge-window order; freqs of dim head_dim / 2
  std::vector<Tensor> pos;
  int64_t max_side = 0;
  for (const plan::Grid& g : grids) {
    Tensor hp = at::arange(g[1], at::kLong).unsqueeze(1).expand({g[1], g[2]});
    Tensor wp = at::arange(g[2], at::kLong).unsqueeze(0).expand({g[1], g[2]});
    hp = hp.reshape({g[1] / m, m, g[2] / m, m}).permute({0, 2, 1, 3}).flatten();
    wp = wp.reshape({g[1] / m, m, g[2] / m, m}).permute({0, 2, 1, 3}).flatten();
    pos.push_back(at::stack({hp, wp}, -1).repeat({g[0], 1}));
    max_side = std::max({max_side, g[1], g[2]});
  }
  const int64_t dim = hd / 2;
  const Tensor inv_freq = 1.0 / at::pow(10000.0, at::arange(0, dim, 2, at::kDouble) / double(dim));
  const Tensor table = at::outer(at::arange(max_side, at::kDouble), inv_freq);
  Tensor rot = table.index({at::cat(pos)}).flatten(1);  // [N, head_dim / 2]
  const auto [window_index, cu_window] = reference_window_index(grids, m, c.window_size, c.patch_size);
  const int64_t N = x.size(0);
  x = x.reshape({N / unit, unit, -1}).index({window_index}).reshape({N, -1});
  rot = rot.reshape({N / unit, unit, -1}).index({window_index}).reshape({N, -1});
  const Tensor emb = at::cat({rot, rot}, -1), cos = emb.cos().unsqueeze(1), sin = emb.sin().unsqueeze(1);
  std::vector<int64_t> cu_frames{0};
  for (const plan::Grid& g : grids)
    for (int64_t t = 0; t < g[0]; ++t) cu_frames.push_back(cu_frames.back() + g[1] * g[2]);
  for (int64_t b = 0; b < c.depth; ++b) {
    const std::string pre = "blocks." + std::to_string(b) + ".";
    const bool full =
        std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(), b) != c.fullatt_block_indexes.end();
    const std::vector<int64_t>& cu = full ? cu_frames : cu_window;
    const Tensor qkv =
        at::linear(rms_norm(x, p.at(pre + "norm1.weight")), p.at(pre + "attn.qkv.weight"), p.at(pre + "attn.qkv.bias"))
            .reshape({N, 3, H, hd});
    Tensor q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    std::vector<Tensor> chunks;
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      const int64_t a = cu[s], len = cu[s + 1] - cu[s];
      const Tensor qs = q.narrow(0, a, len).transpose(0, 1), ks = k.narrow(0, a, len).transpose(0, 1);
      const Tensor w = at::softmax(at::matmul(qs, ks.transpose(1, 2)) / std::sqrt(double(hd)), -1);
      chunks.push_back(at::matmul(w, v.narrow(0, a, len).transpose(0, 1)).transpose(0, 1));
    }
    const Tensor attn = at::cat(chunks).reshape({N, D});
    x = x + at::linear(attn, p.at(pre + "attn.proj.weight"), p.at(pre + "attn.proj.bias"));
    const Tensor h = rms_norm(x, p.at(pre + "norm2.weight"));
    const Tensor gate = at::linear(h, p.at(pre + "mlp.gate_proj.weight"), p.at(pre + "mlp.gate_proj.bias"));
    const Tensor up = at::linear(h, p.at(pre + "mlp.up_proj.weight"), p.at(pre + "mlp.up_proj.bias"));
    x = x + at::linear(at::silu(gate) * up, p.at(pre + "mlp.down_proj.weight"), p.at(pre + "mlp.down_proj.bias"));
  }
  Tensor merged = rms_norm(x, p.at("merger.ln_q.weight")).view({-1, D * unit});
  merged = at::linear(at::gelu(at::linear(merged, p.at("merger.mlp.0.weight"), p.at("merger.mlp.0.bias"))),
                      p.at("merger.mlp.2.weight"), p.at("merger.mlp.2.bias"));
  return merged.index({at::argsort(window_index)});
}

// An image whose merged grid (3 × 5) leaves short windows, one (4 × 4) that windows
// tile exactly, and a two-frame video.
const std::vector<plan::Grid> kGrids = {{1, 6, 10}, {1, 8, 8}, {2, 4, 6}};

int64_t patches_of(const std::vector<plan::Grid>& grids) {
  int64_t n = 0;
  for (const plan::Grid& g : grids) n += g[0] * g[1] * g[2];
  return n;
}

}  // namespace

TEST(Qwen2_5WindowIndex, MatchesTransformersAndInverts) {
  for (const int64_t window : {4, 8, 12, 40}) {  // 1, 2, 3 and 10 merged patches per side
    SCOPED_TRACE("window_size " + std::to_string(window));
    const model::WindowIndex wi = model::window_index(kGrids, 2, window / 4);
    const auto [index, cu] = reference_window_index(kGrids, 2, window, 2);
    ASSERT_EQ(static_cast<int64_t>(wi.order.size()), index.size(0));
    for (size_t k = 0; k < wi.order.size(); ++k) ASSERT_EQ(wi.order[k], index[k].item<int64_t>()) << k;
    std::vector<int64_t> mine{0};
    for (int64_t u : wi.window_units) mine.push_back(mine.back() + u * 4);
    EXPECT_EQ(mine, cu);
    const std::vector<int64_t> inverse = wi.inverse();
    const Tensor argsort = at::argsort(index);
    for (size_t u = 0; u < inverse.size(); ++u) {
      ASSERT_EQ(inverse[u], argsort[u].item<int64_t>());
      ASSERT_EQ(wi.order[inverse[u]], static_cast<int64_t>(u));
    }
  }
  EXPECT_THAT([] { model::window_index(kGrids, 2, 0); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("must hold at least one")));
}

// Rows and every parameter gradient of the tower against the reference, fp64.
TEST(Qwen2_5Vision, EqualsTransformersFormulas) {
  const model::QwenVisionConfig c = vision_of(tiny_qwen2_5_json());
  at::manual_seed(3);
  model::QwenVisionEncoder tower(c, model::QwenVariant::qwen2_5_vl);
  tower.to(at::kDouble);
  for (auto& p : tower.parameters()) {  // off the trivial init (RMSNorm weights 1, biases 0)
    at::NoGradGuard no_grad;
    p.add_(at::randn_like(p) * 0.1);
  }
  const Tensor pixels = at::randn({patches_of(kGrids), 24}, at::kDouble);
  const Tensor rows = tower.forward(pixels, kGrids).rows;
  const Tensor probe = at::randn_like(rows);
  (rows * probe).sum().backward();

  std::map<std::string, Tensor> ref_params;
  for (const auto& item : tower.named_parameters())
    ref_params[item.key()] = item.value().detach().clone().requires_grad_();
  const Tensor want = reference_tower(ref_params, c, pixels, kGrids);
  (want * probe).sum().backward();
  ASSERT_EQ(rows.sizes(), want.sizes());
  EXPECT_TRUE(at::allclose(rows, want, 1e-10, 1e-12)) << (rows - want).abs().max().item<double>();
  for (const auto& item : tower.named_parameters()) {
    const Tensor& g = item.value().grad();
    const Tensor& r = ref_params.at(item.key()).grad();
    ASSERT_TRUE(g.defined() && r.defined()) << item.key();
    EXPECT_GT(r.abs().max().item<double>(), 0) << item.key() << " gets no gradient in the reference";
    EXPECT_TRUE(at::allclose(g, r, 1e-9, 1e-12)) << item.key() << ": " << (g - r).abs().max().item<double>();
  }
}

// A windowed block whose window holds the whole frame is the full-attention block;
// with smaller windows it differs (the windows are real).
TEST(Qwen2_5Vision, WindowedBlockVsFullAttentionBlock) {
  nlohmann::json windowed = tiny_qwen2_5_json(), full = windowed;
  windowed["vision_config"]["fullatt_block_indexes"] = nlohmann::json::array();
  full["vision_config"]["fullatt_block_indexes"] = {0, 1};
  auto rows_of = [](const nlohmann::json& j, const std::vector<plan::Grid>& grids) {
    at::manual_seed(5);
    model::QwenVisionEncoder tower(vision_of(j), model::QwenVariant::qwen2_5_vl);
    tower.to(at::kDouble);
    at::manual_seed(6);
    return tower.forward(at::randn({patches_of(grids), 24}, at::kDouble), grids).rows.detach();
  };
  const std::vector<plan::Grid> small = {{1, 4, 4}, {2, 2, 4}};  // merged 2 × 2, 1 × 2: one window each
  EXPECT_TRUE(at::allclose(rows_of(windowed, small), rows_of(full, small), 1e-12, 1e-14));
  EXPECT_FALSE(at::allclose(rows_of(windowed, kGrids), rows_of(full, kGrids), 1e-6, 1e-8));
  // windows of 10 merged patches cover every frame of kGrids: windowed = full again
  windowed["vision_config"]["window_size"] = 40;
  full["vision_config"]["window_size"] = 40;
  EXPECT_TRUE(at::allclose(rows_of(windowed, kGrids), rows_of(full, kGrids), 1e-12, 1e-14));
}

TEST(Qwen2_5Vision, WindowSizeMustHoldWholeMergedPatches) {
  for (const int window : {2, 6}) {
    nlohmann::json j = tiny_qwen2_5_json();
    j["vision_config"]["window_size"] = window;
    EXPECT_THAT([&] { model::parse_model_config(j, "bad.json"); },
                ::testing::ThrowsMessage<Error>(
                    ::testing::HasSubstr("bad.json: vision_config.window_size (" + std::to_string(window) +
                                         ") must be a multiple of patch_size * spatial_merge_size (2 * 2 = 4)")));
  }
  nlohmann::json j = tiny_qwen2_5_json();
  j["vision_config"]["window_size"] = 0;
  EXPECT_THAT([&] { model::parse_model_config(j, "bad.json"); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("vision_config.window_size")));
}
