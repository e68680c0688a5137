// InternVL against references written here from transformers' formulas (modeling_internvl.py,
// the Qwen2 decoder, GotOcr2's tiling), in fp64: the pixel shuffle, the InternViT tower (both
// norm types, with and without QK-norm and the final LayerNorm), the projector, the tile grid,
// and the one-process model's loss and every gradient. Then every mesh of 1-4 ranks equals one
// process in every vision mode, on a batch where some rank encodes nothing and an image's
// rows straddle a shard border; and tile counts that do not match the placeholders are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/model/families/internvl/dynamic_tiling.h"
#include "mmsp/model/families/internvl/intern_vit.h"
#include "mmsp/model/families/internvl/internvl_config.h"
#include "mmsp/model/families/internvl/internvl_model.h"
#include "mmsp/model/families/internvl/internvl_projector.h"
#include "mmsp/model/families/internvl/pixel_shuffle.h"
#include "mmsp/model/family.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/parallel/step_parallelism.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "multirank.h"
#include "vlm_step.h"

using namespace mmsp;
using at::Tensor;
using ::testing::HasSubstr;

namespace {

using test::kStart, test::kEnd, test::kImage, test::text;
using Params = std::map<std::string, Tensor>;

// Tiny InternVL: 8-pixel tiles of 2-pixel patches (4×4 patches, 4 rows per tile after the
// 2×2 pixel shuffle). `v2`: RMSNorm layers, QK-norm, no q/k/v bias, the final LayerNorm
// (InternViT-6B's options); otherwise InternViT-300M's (LayerNorm, q/k/v bias).
model::ModelConfig tiny_internvl(bool v2 = false) {
  nlohmann::json vision = {{"model_type", "internvl_vision"},
                           {"hidden_size", 16},
                           {"intermediate_size", 24},
                           {"num_hidden_layers", 2},
                           {"num_attention_heads", 2},
                           {"image_size", {8, 8}},
                           {"patch_size", {2, 2}},
                           {"hidden_act", "gelu"},
                           {"layer_norm_eps", 1e-6},
                           {"attention_bias", !v2},
                           {"use_qk_norm", v2},
                           {"norm_type", v2 ? "rms_norm" : "layer_norm"},
                           {"use_mean_pooling", !v2}};
  nlohmann::json c = {{"model_type", "internvl"},
                      {"image_token_id", kImage},
                      {"image_start_token_id", kStart},
                      {"image_end_token_id", kEnd},
                      {"downsample_ratio", 0.5},
                      {"image_seq_length", 4},
                      {"projector_hidden_act", "gelu"},
                      {"vision_feature_layer", -1},
                      {"vision_feature_select_strategy", "default"},
                      {"text_config",
                       {{"model_type", "qwen2"},
                        {"vocab_size", 128},
                        {"hidden_size", 32},
                        {"intermediate_size", 48},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"rms_norm_eps", 1e-6},
                        {"rope_theta", 10000.0},
                        {"tie_word_embeddings", false}}},
                      {"vision_config", vision}};
  return model::parse_model_config(c, "tiny internvl");
}

// <img> + <IMG_CONTEXT> × 4·tiles + </img>, grid [tiles, 4, 4].
void image(plan::Sequence& s, int tiles) {
  s.input_ids.push_back(kStart);
  for (int i = 0; i < 4 * tiles; ++i) s.input_ids.push_back(kImage);
  s.input_ids.push_back(kEnd);
  s.image_grid_thw.push_back({tiles, 4, 4});
}

// Images of 3, 1 and 2 tiles (a 3-tile one is a 2-tile grid + its thumbnail) among text.
plan::Batch internvl_batch() {
  plan::Sequence a, b, c, d;
  text(a, 3, 1), image(a, 3), text(a, 6, 2);
  text(b, 5, 3), image(b, 1), text(b, 3, 4), image(b, 2), text(b, 2, 5);
  text(c, 9, 6);
  text(d, 21, 7);
  return {{a, b, c, d}};
}
constexpr int64_t kTiles = 6;

Params params_of(const torch::nn::Module& m) {
  Params p;
  for (const auto& item : m.named_parameters()) p[item.key()] = item.value();
  return p;
}

Tensor layer_norm_ref(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const Tensor mean = x.mean(-1, true), var = (x - mean).pow(2).mean(-1, true);
  return (x - mean) / at::sqrt(var + eps) * w + b;
}
Tensor rms_ref(const Tensor& x, const Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
}
Tensor gelu_ref(const Tensor& x) { return 0.5 * x * (1 + at::erf(x / std::sqrt(2.0))); }
Tensor lin(const Params& p, const std::string& name, const Tensor& x) {
  Tensor y = at::matmul(x, p.at(name + ".weight").t());
  return p.count(name + ".bias") ? y + p.at(name + ".bias") : y;
}

// InternVLVisionModel + get_image_features' class-token drop, from transformers' code:
// Conv2d, cat(cls), + positions, layers (layernorm_before, q/k/v, q_norm/k_norm over the
// width, eager attention, projection_layer, lambda_1, residual, layernorm_after, MLP,
// lambda_2, residual), layernorm unless use_mean_pooling. `pre`: "vision_tower." or "".
Tensor tower_ref(const Params& p, const model::InternVisionConfig& c, const Tensor& tiles, const std::string& pre) {
  const int64_t N = tiles.size(0), D = c.hidden_size, H = c.num_attention_heads, hd = D / H;
  auto norm = [&](const std::string& name, const Tensor& x) {
    return c.norm_type == "rms_norm"
               ? rms_ref(x, p.at(name + ".weight"), c.layer_norm_eps)
               : layer_norm_ref(x, p.at(name + ".weight"), p.at(name + ".bias"), c.layer_norm_eps);
  };
  Tensor x = at::conv2d(tiles, p.at(pre + "embeddings.patch_embeddings.projection.weight"),
                        p.at(pre + "embeddings.patch_embeddings.projection.bias"), {c.patch_size, c.patch_size});
  x = x.flatten(2).transpose(1, 2);  // [N, P, D]
  x = at::cat({p.at(pre + "embeddings.cls_token").expand({N, 1, D}), x}, 1) +
      p.at(pre + "embeddings.position_embeddings");
  const int64_t S = x.size(1);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string L = pre + "encoder.layer." + std::to_string(l) + ".";
    Tensor h = norm(L + "layernorm_before", x);
    Tensor q = lin(p, L + "attention.q_proj", h), k = lin(p, L + "attention.k_proj", h),
           v = lin(p, L + "attention.v_proj", h);
    if (c.use_qk_norm) {
      q = rms_ref(q, p.at(L + "attention.q_norm.weight"), 1e-6);
      k = rms_ref(k, p.at(L + "attention.k_norm.weight"), 1e-6);
    }
    q = q.reshape({N, S, H, hd}).transpose(1, 2), k = k.reshape({N, S, H, hd}).transpose(1, 2);
    v = v.reshape({N, S, H, hd}).transpose(1, 2);
    Tensor w = at::softmax(at::matmul(q, k.transpose(2, 3)) * std::pow(double(hd), -0.5), -1);
    Tensor o = lin(p, L + "attention.projection_layer", at::matmul(w, v).transpose(1, 2).reshape({N, S, D}));
    x = x + p.at(L + "lambda_1") * o;
    Tensor m = lin(p, L + "mlp.fc2", gelu_ref(lin(p, L + "mlp.fc1", norm(L + "layernorm_after", x))));
    x = x + p.at(L + "lambda_2") * m;
  }
  if (!c.use_mean_pooling)
    x = layer_norm_ref(x, p.at(pre + "layernorm.weight"), p.at(pre + "layernorm.bias"), c.layer_norm_eps);
  return x.narrow(1, 1, S - 1);
}

// InternVLModel.pixel_shuffle as transformers writes it (its width/height names swapped),
// with scale_factor = 1/k: reshape to the square grid, then view, permute, view, permute.
Tensor pixel_shuffle_ref(const Tensor& features, int64_t k) {
  const int64_t N = features.size(0), side = int64_t(std::llround(std::sqrt(double(features.size(1))))),
                C = features.size(2);
  Tensor x = features.reshape({N, side, side, C});
  const int64_t width = side, height = side;
  x = x.view({N, width, height / k, C * k});
  x = x.permute({0, 2, 1, 3}).contiguous();
  x = x.view({N, height / k, width / k, C * k * k});
  x = x.permute({0, 2, 1, 3}).contiguous();
  return x.reshape({N, -1, C * k * k});
}

Tensor projector_ref(const Params& p, const std::string& pre, const Tensor& x) {
  Tensor h = layer_norm_ref(x, p.at(pre + "layer_norm.weight"), p.at(pre + "layer_norm.bias"), 1e-5);
  return lin(p, pre + "linear_2", gelu_ref(lin(p, pre + "linear_1", h)));
}

Tensor rotate_half(const Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// Qwen2Model + lm_head on one sequence's embeddings [T, hidden] (positions 0..T-1, causal).
Tensor qwen2_logits_ref(const Params& p, const model::TextConfig& c, Tensor x) {
  const int64_t T = x.size(0), H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const std::string M = "language_model.model.";
  Tensor inv = at::pow(c.rope_theta, at::arange(0, D, 2, at::kDouble) / double(D)).reciprocal();
  Tensor ang = at::arange(T, at::kDouble).unsqueeze(1) * inv.unsqueeze(0);
  Tensor cos = at::cat({ang.cos(), ang.cos()}, 1).unsqueeze(1), sin = at::cat({ang.sin(), ang.sin()}, 1).unsqueeze(1);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string L = M + "layers." + std::to_string(l) + ".";
    Tensor h = rms_ref(x, p.at(L + "input_layernorm.weight"), c.rms_norm_eps);
    Tensor q = lin(p, L + "self_attn.q_proj", h).view({T, H, D}),
           k = lin(p, L + "self_attn.k_proj", h).view({T, Hkv, D});
    Tensor v = lin(p, L + "self_attn.v_proj", h).view({T, Hkv, D});
    q = (q * cos + rotate_half(q) * sin).transpose(0, 1);
    k = (k * cos + rotate_half(k) * sin).repeat_interleave(H / Hkv, 1).transpose(0, 1);
    v = v.repeat_interleave(H / Hkv, 1).transpose(0, 1);
    Tensor s = (at::matmul(q, k.transpose(1, 2)) / std::sqrt(double(D)))
                   .masked_fill(at::ones({T, T}, at::kBool).triu(1), -INFINITY);
    x = x + lin(p, L + "self_attn.o_proj", at::matmul(at::softmax(s, -1), v).transpose(0, 1).reshape({T, H * D}));
    Tensor h2 = rms_ref(x, p.at(L + "post_attention_layernorm.weight"), c.rms_norm_eps);
    x = x + lin(p, L + "mlp.down_proj", at::silu(lin(p, L + "mlp.gate_proj", h2)) * lin(p, L + "mlp.up_proj", h2));
  }
  return lin(p, "language_model.lm_head", rms_ref(x, p.at(M + "norm.weight"), c.rms_norm_eps));
}

// InternVLForConditionalGeneration's loss over the batch: image features masked_scatter'ed
// into <IMG_CONTEXT> tokens in batch order, labels shifted, placeholders not targets,
// the sum over every kept label divided by their count.
Tensor internvl_loss_ref(const Params& p, const model::ModelConfig& c, const plan::Batch& batch, const Tensor& tiles) {
  const Tensor features = tower_ref(p, *intern_vision_of(c), tiles, "vision_tower.");
  const Tensor rows =
      projector_ref(p, "multi_modal_projector.", pixel_shuffle_ref(features, 2)).reshape({-1, c.text.hidden_size});
  int64_t next_row = 0, count = 0;
  Tensor total = at::zeros({}, at::kDouble);
  for (const plan::Sequence& s : batch.sequences) {
    const Tensor ids = at::tensor(s.input_ids, at::kLong);
    Tensor x = at::embedding(p.at("language_model.model.embed_tokens.weight"), ids);
    const Tensor mask = ids == kImage;
    const int64_t n = mask.sum().item<int64_t>();
    x = x.masked_scatter(mask.unsqueeze(1), rows.narrow(0, next_row, n));
    next_row += n;
    const Tensor logits = qwen2_logits_ref(p, c.text, x);
    for (size_t i = 0; i + 1 < s.input_ids.size(); ++i) {
      if (s.input_ids[i + 1] == kImage) continue;
      total = total - at::log_softmax(logits[int64_t(i)], 0)[s.input_ids[i + 1]];
      ++count;
    }
  }
  return total / double(count);
}

}  // namespace

TEST(InternVLPixelShuffle, EqualsTransformersAndPutsEachPatchWhereItBelongs) {
  at::manual_seed(1);
  for (int64_t k : {2, 3}) {
    const Tensor x = at::randn({3, 36, 5}, at::kDouble);
    EXPECT_TRUE(at::equal(model::pixel_shuffle(x, k), pixel_shuffle_ref(x, k))) << "k " << k;
  }
  // Identity: the value of patch (r, c), channel d is 1000·r + 10·c + d; output row (R, C)
  // holds the k×k block at (kR, kC), its first row first.
  const int64_t side = 4, D = 3;
  Tensor x = at::empty({1, side * side, D}, at::kDouble);
  for (int64_t r = 0; r < side; ++r)
    for (int64_t c = 0; c < side; ++c)
      for (int64_t d = 0; d < D; ++d) x[0][r * side + c][d] = 1000 * r + 10 * c + d;
  const Tensor y = model::pixel_shuffle(x, 2);
  ASSERT_EQ(y.sizes(), (at::IntArrayRef{1, 4, 4 * D}));
  for (int64_t R = 0; R < 2; ++R)
    for (int64_t C = 0; C < 2; ++C)
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 2; ++j)
          for (int64_t d = 0; d < D; ++d)
            EXPECT_EQ(y[0][R * 2 + C][(i * 2 + j) * D + d].item<double>(), 1000 * (2 * R + i) + 10 * (2 * C + j) + d);
}

TEST(InternVLTower, EqualsTransformersInternVLVisionModelWithEveryGradient) {
  for (bool v2 : {false, true}) {
    const model::ModelConfig config = tiny_internvl(v2);
    at::manual_seed(3);
    model::InternVisionTower tower(*intern_vision_of(config));
    tower.to(at::kDouble);
    for (auto& item : tower.named_parameters())  // layer scales and norms away from their initial constants
      if (item.key().find("lambda") != std::string::npos || item.key().find("norm") != std::string::npos) {
        at::NoGradGuard no_grad;
        item.value().add_(at::randn_like(item.value()) * 0.3);
      }
    const Tensor tiles = at::randn({3, 3, 8, 8}, at::kDouble);
    const Tensor probe = at::randn({3, 16, 16}, at::kDouble);
    (tower.forward(tiles) * probe).sum().backward();
    Params ref;
    for (const auto& [name, t] : params_of(tower)) ref[name] = t.detach().clone().requires_grad_();
    const Tensor got = tower.forward(tiles), want = tower_ref(ref, *intern_vision_of(config), tiles, "");
    EXPECT_TRUE(at::allclose(got, want, 1e-12, 1e-12))
        << "v2 " << v2 << ": " << (got - want).abs().max().item<double>();
    (want * probe).sum().backward();
    for (const auto& [name, t] : params_of(tower)) {
      ASSERT_TRUE(ref.at(name).grad().defined()) << name;
      EXPECT_GT(ref.at(name).grad().abs().max().item<double>(), 0) << name;
      EXPECT_TRUE(at::allclose(t.grad(), ref.at(name).grad(), 1e-10, 1e-12)) << "v2 " << v2 << " gradient of " << name;
    }
  }
}

TEST(InternVLProjector, EqualsTransformersMultiModalProjector) {
  at::manual_seed(4);
  model::InternVLProjector projector(64, 32, "gelu", 0.02);
  projector.to(at::kDouble);
  const Tensor x = at::randn({5, 64}, at::kDouble) * 3 + 1;
  EXPECT_TRUE(at::allclose(projector.forward(x), projector_ref(params_of(projector), "", x), 1e-12, 1e-13));
}

// get_optimal_tiled_canvas, written from transformers' loop as a scan that keeps every
// candidate with the best distance and then replays the tie rule over them in order.
model::TileGrid tile_grid_ref(int64_t height, int64_t width, int64_t tile, int64_t lo, int64_t hi) {
  std::vector<std::pair<int64_t, int64_t>> grids;  // (columns, rows): width-major, then stable by area
  for (int64_t w = 1; w <= hi; ++w)
    for (int64_t h = 1; h <= hi; ++h)
      if (w * h >= lo && w * h <= hi) grids.emplace_back(w, h);
  std::stable_sort(grids.begin(), grids.end(), [](auto a, auto b) { return a.first * a.second < b.first * b.second; });
  double best = INFINITY;
  for (auto [w, h] : grids) best = std::min(best, std::fabs(double(width) / double(height) - double(w) / double(h)));
  std::pair<int64_t, int64_t> pick{0, 0};
  for (auto [w, h] : grids) {
    if (std::fabs(double(width) / double(height) - double(w) / double(h)) != best) continue;
    if (pick.first == 0 || double(width) * double(height) > 0.5 * double(tile * tile) * double(w * h)) pick = {w, h};
  }
  return {pick.first, pick.second};
}

TEST(InternVLTiling, GridEqualsTransformersOnManySizes) {
  model::TilingOptions o;  // 448 px, 1..12 tiles, thumbnail
  // Hand-checked: a 448² square stays one tile (no thumbnail); 1000² takes 3×3 (its area
  // beats half of 9 tiles) + thumbnail; 896×448 (W×H) is 2×1 + thumbnail; 600×800 is 3×4.
  EXPECT_EQ(model::closest_tile_grid(448, 448, o), (model::TileGrid{1, 1}));
  EXPECT_EQ(model::tile_count(448, 448, o), 1);
  EXPECT_EQ(model::closest_tile_grid(1000, 1000, o), (model::TileGrid{3, 3}));
  EXPECT_EQ(model::tile_count(1000, 1000, o), 10);
  EXPECT_EQ(model::closest_tile_grid(448, 896, o), (model::TileGrid{2, 1}));
  EXPECT_EQ(model::tile_count(448, 896, o), 3);
  EXPECT_EQ(model::closest_tile_grid(800, 600, o), (model::TileGrid{3, 4}));
  for (int64_t h = 1; h < 3000; h += 97)
    for (int64_t w = 1; w < 3000; w += 89)
      for (auto [lo, hi] : {std::pair<int64_t, int64_t>{1, 12}, {1, 6}, {2, 9}}) {
        o.min_tiles = lo, o.max_tiles = hi;
        ASSERT_EQ(model::closest_tile_grid(h, w, o), tile_grid_ref(h, w, 448, lo, hi))
            << h << " x " << w << " " << lo << ".." << hi;
      }
  o.use_thumbnail = false;
  o.min_tiles = 1, o.max_tiles = 12;
  EXPECT_EQ(model::tile_count(1000, 1000, o), 9);
}

TEST(InternVLTiling, CutTilesPutsEachPixelInItsTile) {
  const int64_t S = 3, C = 2;
  const model::TileGrid g{3, 2};  // 3 across, 2 down
  Tensor canvas = at::empty({C, g.rows * S, g.columns * S}, at::kDouble);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < g.rows * S; ++y)
      for (int64_t x = 0; x < g.columns * S; ++x) canvas[c][y][x] = 10000 * c + 100 * y + x;
  const Tensor tiles = model::cut_tiles(canvas, g, S);
  ASSERT_EQ(tiles.sizes(), (at::IntArrayRef{6, C, S, S}));
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x)
          EXPECT_EQ(tiles[i][c][y][x].item<double>(), 10000 * c + 100 * ((i / 3) * S + y) + (i % 3) * S + x);
}

// The registry's InternVL geometry is the processor's: the file's own size gives the tile
// count (a grid cannot: it records tiles, not pixels), placeholders are tiles ·
// image_seq_length, and the item's pixels are the tiles, ImageNet-normalised.
TEST(InternVLGeometry, GridPlaceholdersAndPixelsAreTheProcessors) {
  const model::ModelConfig config = tiny_internvl();
  const auto geometry = model::pixel_geometry(config);
  // 20 × 10 pixels (W × H): a 2 × 1 grid of 8-pixel tiles + the thumbnail.
  const plan::Grid g = geometry->grid_for(1, 20, 10, "image 0");
  EXPECT_EQ(g, (plan::Grid{3, 4, 4}));
  EXPECT_EQ(geometry->placeholder_rows(g), 3 * 4);
  EXPECT_EQ(geometry->batch_rows(g), 3);
  EXPECT_EQ(geometry->item_shape(g), (std::vector<int64_t>{3, 3, 8, 8}));
  EXPECT_EQ(geometry->frame_size(g, 20, 10), (std::pair<int64_t, int64_t>{20, 10}));
  EXPECT_EQ(geometry->grid_mismatch(g, 1, 20, 10, "image 0"), "");
  EXPECT_THAT(geometry->grid_mismatch({2, 4, 4}, 1, 20, 10, "image 0"),
              HasSubstr("internvl cuts image 0 (20 x 10 pixels) into 3 tiles of 8 px: grid [3, 4, 4]"));
  EXPECT_FALSE(geometry->takes_videos());
  at::manual_seed(3);
  const Tensor frames = at::rand({1, 3, 10, 20});
  const Tensor mean = at::tensor({0.485, 0.456, 0.406}, at::kFloat).view({1, 3, 1, 1});
  const Tensor stdev = at::tensor({0.229, 0.224, 0.225}, at::kFloat).view({1, 3, 1, 1});
  model::TilingOptions tiling;
  tiling.tile_size = 8;
  const Tensor want = (model::tile_image(frames[0], tiling) - mean) / stdev;
  EXPECT_TRUE(at::allclose(geometry->item_pixels(frames), want, 1e-6, 1e-6));
}

TEST(InternVLModel, OneProcessLossAndEveryGradientEqualTransformers) {
  for (bool v2 : {false, true}) {
    const model::ModelConfig config = tiny_internvl(v2);
    const plan::Batch batch = internvl_batch();
    const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
    const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
    at::manual_seed(11);
    auto built = model::build_vlm(config);
    model::Vlm& vlm = *built;
    vlm.to(at::kDouble);
    for (auto& item : vlm.named_parameters())
      if (item.key().find("lambda") != std::string::npos) {
        at::NoGradGuard no_grad;
        item.value().add_(at::randn_like(item.value()));
      }
    const Tensor tiles = at::randn({kTiles, 3, 8, 8}, at::kDouble);
    auto out = parallel::forward_step(vlm, batch, whole, {tiles, {}}, {solo, solo, solo}, model::VisionMode::routed);
    const Tensor loss = train::causal_lm_loss(out.logits(), out.labels, out.label_count);
    loss.backward();
    Params ref;
    for (const auto& [name, t] : params_of(vlm)) ref[name] = t.detach().clone().requires_grad_();
    const Tensor want = internvl_loss_ref(ref, config, batch, tiles);
    want.backward();
    EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-12 * want.item<double>()) << "v2 " << v2;
    for (const auto& [name, t] : params_of(vlm)) {
      ASSERT_TRUE(ref.at(name).grad().defined()) << name;
      const Tensor g = t.grad().defined() ? t.grad() : at::zeros_like(t);
      EXPECT_TRUE(at::allclose(g, ref.at(name).grad(), 1e-9, 1e-13))
          << "v2 " << v2 << " gradient of " << name << ": " << (g - ref.at(name).grad()).abs().max().item<double>();
    }
  }
}

TEST(InternVLNames, AreTheCheckpointNames) {
  auto built = model::build_vlm(tiny_internvl(true));
  model::Vlm& vlm = *built;
  std::set<std::string> names;
  for (const auto& item : vlm.named_parameters()) names.insert(item.key());
  for (const char* name :
       {"vision_tower.embeddings.cls_token", "vision_tower.embeddings.position_embeddings",
        "vision_tower.embeddings.patch_embeddings.projection.weight",
        "vision_tower.embeddings.patch_embeddings.projection.bias",
        "vision_tower.encoder.layer.1.layernorm_before.weight", "vision_tower.encoder.layer.0.attention.q_proj.weight",
        "vision_tower.encoder.layer.0.attention.q_norm.weight", "vision_tower.encoder.layer.0.attention.k_norm.weight",
        "vision_tower.encoder.layer.0.attention.projection_layer.bias", "vision_tower.encoder.layer.0.lambda_1",
        "vision_tower.encoder.layer.1.lambda_2", "vision_tower.encoder.layer.1.mlp.fc2.weight",
        "vision_tower.layernorm.weight", "multi_modal_projector.layer_norm.weight",
        "multi_modal_projector.linear_1.weight", "multi_modal_projector.linear_2.bias",
        "language_model.model.embed_tokens.weight", "language_model.model.layers.1.self_attn.q_proj.bias",
        "language_model.lm_head.weight"})
    EXPECT_EQ(names.count(name), 1u) << name;
  EXPECT_EQ(names.count("vision_tower.encoder.layer.0.attention.q_proj.bias"), 0u);  // attention_bias false
  EXPECT_EQ(names.count("vision_tower.encoder.layer.0.layernorm_before.bias"), 0u);  // RMSNorm
}

TEST(InternVLBatch, HasAnEmptyEncoderAndAStraddlingImageOnFourRanks) {
  const model::ModelConfig config = tiny_internvl();
  const plan::Batch batch = internvl_batch();
  for (const plan::Mesh shape : {plan::Mesh{1, 1, 4}, plan::Mesh{1, 2, 2}}) {
    plan::PlanOptions options;
    options.mesh = shape;
    const plan::StepPlan p = plan::make_step_plan(batch, config.conventions, options, 0);
    std::set<int> encoders;
    for (const auto& item : p.rows[0].items) encoders.insert(item.encoder_rank);
    EXPECT_LT(encoders.size(), 4u) << shape.str();
    std::vector<std::set<int>> holders(p.rows[0].items.size());
    for (int r = 0; r < 4; ++r)
      for (const auto& from : plan::make_rank_plan(batch, p, r).routes.recv)
        for (const auto& row : from) holders[row.item].insert(r);
    bool straddles = false;
    for (const auto& h : holders) straddles |= h.size() > 1;
    EXPECT_TRUE(straddles) << shape.str();
  }
}

TEST(InternVLBadInput, TileCountsThatDoNotMatchThePlaceholdersAreRefusedBeforeAnyCollective) {
  const model::ModelConfig config = tiny_internvl();
  plan::Batch batch = internvl_batch();
  batch.sequences[0].image_grid_thw[0] = {2, 4, 4};  // 2 tiles, but 12 placeholders (3 tiles)
  try {
    plan::make_step_plan(batch, config.conventions, {}, 0);
    ADD_FAILURE() << "a grid of 2 tiles under 12 placeholders was accepted";
  } catch (const Error& e) { EXPECT_THAT(e.what(), HasSubstr("image 0 has 12 placeholder tokens but grid [2, 4, 4]")); }
  // A tile that is not image_size: the tower refuses it before the step's first collective.
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::Batch good = internvl_batch();
  const plan::StepPlan whole = plan::make_step_plan(good, config.conventions, {}, 0);
  auto built = model::build_vlm(config);
  model::Vlm& vlm = *built;
  try {
    parallel::forward_step(vlm, good, whole, {at::randn({kTiles, 3, 16, 16}), {}}, {solo, solo, solo},
                           model::VisionMode::routed);
    ADD_FAILURE() << "16-pixel tiles were accepted by an 8-pixel tower";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("InternVL tiles must be [N, 3, 8, 8] with N = 6 (the image_grid_thw tile counts of "
                                    "the images held here), got [6, 3, 16, 16]"));
  }
  // The vision part alone checks the same from the plan (the Vlm interface passes no batch).
  try {
    vlm.vision_rows(whole, {at::randn({kTiles - 1, 3, 8, 8}), {}},
                    parallel::vision_router(whole, solo, model::VisionMode::routed));
    ADD_FAILURE() << "5 tiles were accepted for 6";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("InternVL tiles must be [N, 3, 8, 8] with N = 6 (the image_grid_thw tile counts of "
                                    "the images held here), got [5, 3, 8, 8]"));
  }
}

namespace {

test::StepResult run_internvl(const model::ModelConfig& config, const plan::Batch& batch, const plan::StepPlan& plan,
                              const parallel::StepGroups& groups, const dist::GroupPtr& world, model::VisionMode mode,
                              at::ScalarType dtype, int64_t tiles = kTiles) {
  at::manual_seed(13);  // the tiles, identical everywhere
  const model::PixelInputs pixels{at::randn({tiles, 3, 8, 8}, dtype), {}};
  return test::run_model(config, batch, plan, groups, world, mode, pixels, dtype);
}

}  // namespace

class InternVLMesh : public ::testing::TestWithParam<std::tuple<bool, at::ScalarType>> {};

TEST_P(InternVLMesh, MultiRankEqualsOneProcessInEveryVisionMode) {
  const auto [v2, dtype] = GetParam();
  const double rtol = dtype == at::kDouble ? 1e-9 : 1e-4;
  const model::ModelConfig config = tiny_internvl(v2);
  const plan::Batch batch = internvl_batch();
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const test::StepResult ref =
      run_internvl(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed, dtype);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;  // 4 query heads, 2 K/V heads: Ulysses 3 cannot split them
    plan::PlanOptions options;
    options.mesh = mesh.shape();
    const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
    for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
      if (v2 && mode != model::VisionMode::routed) continue;  // the v2 tower's options change no data movement
      const test::StepResult got =
          run_internvl(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()}, mesh.world(), mode, dtype);
      test::expect_same_step(got, ref, rtol, mesh.shape().str() + " " + model::to_string(mode) + (v2 ? " v2" : ""));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MultiRank, InternVLMesh,
                         ::testing::Values(std::make_tuple(false, at::kDouble), std::make_tuple(true, at::kDouble),
                                           std::make_tuple(false, at::kFloat)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "v2_" : "v300m_") +
                                  (std::get<1>(info.param) == at::kDouble ? "fp64" : "fp32");
                         });

// Vision-tower SP by tiles: InternViT encodes each tile alone, so a large image's tiles
// spread over the context group with nothing exchanged. An image of 5 tiles split in whole
// tiles (uneven: 3 + 2 on 2 ranks, 2 + 2 + 1 on 3, 2 + 1 + 1 + 1 on 4) beside a 1-tile image
// kept whole (--vision-split 32: it has 16 patches), on every mesh and vision mode: the loss
// and every gradient equal one process's (fp64 1e-9).
TEST(MultiRankInternVLSplit, TilesSpreadOverTheContextGroupEqualOneProcess) {
  const model::ModelConfig config = tiny_internvl();
  plan::Sequence a, b, c, d;
  text(a, 3, 1), image(a, 5), text(a, 6, 2);
  text(b, 5, 3), image(b, 1), text(b, 3, 4);
  text(c, 9, 6);
  text(d, 21, 7);
  const plan::Batch batch{{a, b, c, d}};
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const plan::StepPlan whole = plan::make_step_plan(batch, config.conventions, {}, 0);
  const test::StepResult ref =
      run_internvl(config, batch, whole, {solo, solo, solo}, solo, model::VisionMode::routed, at::kDouble, 6);
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;  // 2 K/V heads
    plan::PlanOptions options;
    options.mesh = mesh.shape();
    options.vision_split = plan::parse_vision_split("32");
    const plan::StepPlan mine = plan::make_step_plan(batch, config.conventions, options, mesh.rank());
    int split = 0;
    for (const plan::RowPlan& row : mine.rows)
      for (const plan::VisionItem& it : row.items) split += it.split();
    EXPECT_EQ(split, mesh.shape().context() > 1 ? 1 : 0) << mesh.shape().str();
    for (auto mode : {model::VisionMode::routed, model::VisionMode::gather, model::VisionMode::replicate}) {
      const test::StepResult got = run_internvl(config, batch, mine, {mesh.context(), mesh.ring(), mesh.ulysses()},
                                                mesh.world(), mode, at::kDouble, 6);
      test::expect_same_step(got, ref, 1e-9, mesh.shape().str() + " split tiles " + model::to_string(mode));
    }
  }
}
