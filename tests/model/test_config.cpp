// Hugging Face configs: the shipped tiny configs, released config.json files (configs/hf/),
// transformers' defaults for missing keys, and an error naming the field for each bad value.
#include <cctype>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "error_of.h"
#include "mmsp/core/check.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/families/internvl/internvl_config.h"
#include "mmsp/model/families/llava/clip_config.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"

namespace mmsp::model {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

const std::string kConfigs = std::string(MMSP_SOURCE_DIR) + "/configs/";

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::string error_of(const json& config) {
  return test::error_of([&] { parse_model_config(config); });
}

// A copy of `base` with the JSON-pointer path set to `value` (or removed when null_out).
json with(json base, const std::string& pointer, const json& value) {
  base[json::json_pointer(pointer)] = value;
  return base;
}

json without(json base, const std::string& pointer) {
  const json::json_pointer p(pointer);
  base[p.parent_pointer()].erase(p.back());
  return base;
}

// ---------- tiny configs ----------

TEST(Config, TinyQwen2VL) {
  const ModelConfig c = load_model_config(kConfigs + "tiny-qwen2-vl.json");
  EXPECT_EQ(c.model_type, "qwen2_vl");
  EXPECT_EQ(c.conventions.name, "qwen2_vl");
  EXPECT_EQ(c.text.hidden_size, 64);
  EXPECT_EQ(c.text.num_hidden_layers, 2);
  EXPECT_EQ(c.text.num_attention_heads, 4);
  EXPECT_EQ(c.text.num_key_value_heads, 2);
  EXPECT_EQ(c.text.head_dim, 16);
  EXPECT_EQ(c.text.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.text.rope_theta, 1e6);
  EXPECT_TRUE(c.text.qkv_bias);
  EXPECT_FALSE(c.text.o_bias);
  EXPECT_FALSE(c.text.qk_norm);
  ASSERT_TRUE((qwen_vision_of(c) != nullptr));
  EXPECT_FALSE((clip_vision_of(c) != nullptr));
  const QwenVisionConfig& v = *qwen_vision_of(c);
  EXPECT_EQ(v.depth, 2);
  EXPECT_EQ(v.hidden_size, 32);        // embed_dim
  EXPECT_EQ(v.intermediate_size, 64);  // embed_dim * mlp_ratio
  EXPECT_EQ(v.out_hidden_size, 64);    // vision_config.hidden_size
  EXPECT_EQ(v.hidden_act, "quick_gelu");
  EXPECT_EQ(v.head_dim(), 16);
  EXPECT_EQ(c.conventions.mrope_section, (std::array<int64_t, 3>{2, 3, 3}));
  EXPECT_FALSE(c.conventions.mrope_interleaved);
  EXPECT_EQ(c.conventions.image_token_id, 151655);
}

TEST(Config, TinyQwen2_5VL) {
  const ModelConfig c = load_model_config(kConfigs + "tiny-qwen2_5-vl.json");
  EXPECT_EQ(c.conventions.name, "qwen2_5_vl");
  const QwenVisionConfig& v = *qwen_vision_of(c);
  EXPECT_EQ(v.hidden_size, 32);
  EXPECT_EQ(v.intermediate_size, 64);
  EXPECT_EQ(v.out_hidden_size, 64);
  EXPECT_EQ(v.hidden_act, "silu");
  EXPECT_EQ(v.window_size, 112);
  EXPECT_EQ(v.fullatt_block_indexes, (std::vector<int64_t>{1}));
  EXPECT_EQ(c.conventions.tokens_per_second, 2.0);
}

TEST(Config, TinyQwen3VL) {
  const ModelConfig c = load_model_config(kConfigs + "tiny-qwen3-vl.json");
  EXPECT_EQ(c.conventions.name, "qwen3_vl");
  EXPECT_EQ(c.text.model_type, "qwen3_vl_text");
  EXPECT_EQ(c.text.hidden_size, 64);
  EXPECT_EQ(c.text.head_dim, 16);
  EXPECT_EQ(c.text.rope_theta, 5e6);
  EXPECT_TRUE(c.text.qk_norm);
  EXPECT_FALSE(c.text.qkv_bias);
  EXPECT_TRUE(c.conventions.mrope_interleaved);
  const QwenVisionConfig& v = *qwen_vision_of(c);
  EXPECT_EQ(v.depth, 3);
  EXPECT_EQ(v.in_channels, 3);
  EXPECT_EQ(v.patch_size, 16);
  EXPECT_EQ(v.num_position_embeddings, 64);
  EXPECT_EQ(v.deepstack_visual_indexes, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(v.hidden_act, "gelu_pytorch_tanh");
}

TEST(Config, TinyLlava) {
  const ModelConfig c = load_model_config(kConfigs + "tiny-llava.json");
  EXPECT_EQ(c.conventions.name, "llava");
  EXPECT_EQ(c.text.model_type, "llama");
  EXPECT_EQ(c.text.hidden_size, 64);
  EXPECT_EQ(c.text.num_key_value_heads, 4);
  EXPECT_EQ(c.text.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.text.rope_theta, 10000.0);
  EXPECT_FALSE(c.text.qkv_bias);
  EXPECT_FALSE((qwen_vision_of(c) != nullptr));
  ASSERT_TRUE((clip_vision_of(c) != nullptr) && (llava_projector_of(c) != nullptr));
  EXPECT_EQ(clip_vision_of(c)->hidden_size, 32);
  EXPECT_EQ(clip_vision_of(c)->num_patches(), 16);
  EXPECT_EQ(clip_vision_of(c)->hidden_act, "quick_gelu");
  EXPECT_EQ(llava_projector_of(c)->vision_feature_layer, -2);
  EXPECT_EQ(llava_projector_of(c)->image_seq_length, 16);
  EXPECT_EQ(c.conventions.image_token_id, 32000);
}

TEST(Config, TinyInternVL) {
  const ModelConfig c = load_model_config(kConfigs + "tiny-internvl.json");
  EXPECT_EQ(c.conventions.name, "internvl");
  EXPECT_EQ(c.text.model_type, "qwen2");
  EXPECT_EQ(c.text.hidden_size, 64);
  EXPECT_EQ(c.text.head_dim, 16);
  EXPECT_TRUE(c.text.qkv_bias);  // Qwen2: q/k/v biases hard-wired
  EXPECT_FALSE(c.text.qk_norm);
  ASSERT_TRUE((intern_vision_of(c) != nullptr) && (internvl_projector_of(c) != nullptr));
  EXPECT_EQ(intern_vision_of(c)->image_size, 56);
  EXPECT_EQ(intern_vision_of(c)->patches_per_side(), 4);
  EXPECT_TRUE(intern_vision_of(c)->attention_bias);
  EXPECT_EQ(internvl_projector_of(c)->scale(), 2);
  EXPECT_EQ(internvl_projector_of(c)->image_seq_length, 4);
  EXPECT_EQ(c.conventions.spatial_merge_size, 2);
  EXPECT_EQ(c.conventions.image_token_id, 151667);
  EXPECT_EQ(c.conventions.vision_start_token_id, 151665);
  EXPECT_FALSE(c.conventions.uses_mrope());
}

TEST(Config, InternVL3_8BAndAQwen3DecoderForInternVL3_5) {
  const ModelConfig c = load_model_config(kConfigs + "hf/InternVL3-8B.json");
  EXPECT_EQ(c.text.hidden_size, 3584);
  EXPECT_EQ(c.text.num_hidden_layers, 28);
  EXPECT_EQ(c.text.num_key_value_heads, 4);
  EXPECT_EQ(c.text.head_dim, 128);
  EXPECT_EQ(c.text.vocab_size, 151674);
  EXPECT_EQ(c.text.rope_theta, 1000000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  const InternVisionConfig& v = *intern_vision_of(c);
  EXPECT_EQ(v.hidden_size, 1024);
  EXPECT_EQ(v.num_hidden_layers, 24);
  EXPECT_EQ(v.image_size, 448);
  EXPECT_EQ(v.patch_size, 14);
  EXPECT_TRUE(v.attention_bias);
  EXPECT_EQ(v.norm_type, "layer_norm");
  EXPECT_EQ(internvl_projector_of(c)->image_seq_length, 256);  // (448 / 14 · 0.5)²
  // InternVL3.5: a qwen3 text_config takes Qwen3Config's defaults (head_dim 128, q/k norm, no bias).
  json j = read_json(kConfigs + "tiny-internvl.json");
  j["text_config"]["model_type"] = "qwen3";
  const ModelConfig q3 = parse_model_config(j);
  EXPECT_EQ(q3.text.model_type, "qwen3");
  EXPECT_EQ(q3.text.head_dim, 128);
  EXPECT_TRUE(q3.text.qk_norm);
  EXPECT_FALSE(q3.text.qkv_bias);
}

TEST(ConfigErrors, InternVLNamesTheFieldAndTheRule) {
  const json tiny = read_json(kConfigs + "tiny-internvl.json");
  EXPECT_THAT(error_of(with(tiny, "/image_seq_length", 16)),
              HasSubstr("image_seq_length (16) must equal the rows a tile yields: "
                        "(image_size / patch_size · downsample_ratio)² = (4 / 2)² = 4"));
  EXPECT_THAT(error_of(with(tiny, "/downsample_ratio", 0.3)), HasSubstr("downsample_ratio"));
  EXPECT_THAT(error_of(with(tiny, "/downsample_ratio", 0.125)),
              HasSubstr("= 4 patches a side must divide by 1/downsample_ratio = 8 for the pixel shuffle"));
  EXPECT_THAT(error_of(with(tiny, "/vision_config/image_size", json({56, 42}))),
              HasSubstr("vision_config.image_size [56,42] must be one side or [side, side]"));
  EXPECT_THAT(error_of(with(tiny, "/vision_config/norm_type", "batch_norm")),
              HasSubstr("vision_config.norm_type \"batch_norm\" is not supported; supported: layer_norm, rms_norm"));
  EXPECT_THAT(error_of(with(tiny, "/vision_feature_select_strategy", "full")),
              HasSubstr("vision_feature_select_strategy \"full\" is not supported for internvl"));
  EXPECT_THAT(error_of(with(tiny, "/vision_feature_layer", -2)),
              HasSubstr("vision_feature_layer (-2) is not supported"));
  EXPECT_THAT(
      error_of(with(tiny, "/text_config/model_type", "llama")),
      HasSubstr("text_config.model_type \"llama\" is not supported for internvl; expected \"qwen2\" or \"qwen3\""));
  EXPECT_THAT(error_of(with(tiny, "/text_config/rope_scaling", json({{"rope_type", "yarn"}}))),
              HasSubstr("InternVL decoders use \"default\" or \"dynamic\""));
  EXPECT_THAT(error_of(with(tiny, "/vision_config/use_mask_token", true)), HasSubstr("use_mask_token is true"));
}

// ---------- released configs ----------

TEST(Config, Qwen2VL7BInstruct) {
  const ModelConfig c = load_model_config(kConfigs + "hf/Qwen2-VL-7B-Instruct.json");
  EXPECT_EQ(c.text.vocab_size, 152064);
  EXPECT_EQ(c.text.hidden_size, 3584);
  EXPECT_EQ(c.text.intermediate_size, 18944);
  EXPECT_EQ(c.text.num_hidden_layers, 28);
  EXPECT_EQ(c.text.num_attention_heads, 28);
  EXPECT_EQ(c.text.num_key_value_heads, 4);
  EXPECT_EQ(c.text.head_dim, 128);
  EXPECT_EQ(c.text.max_position_embeddings, 32768);
  EXPECT_FALSE(c.tie_word_embeddings);
  const QwenVisionConfig& v = *qwen_vision_of(c);
  EXPECT_EQ(v.depth, 32);
  EXPECT_EQ(v.hidden_size, 1280);
  EXPECT_EQ(v.intermediate_size, 5120);
  EXPECT_EQ(v.num_heads, 16);
  EXPECT_EQ(v.head_dim(), 80);
  EXPECT_EQ(v.out_hidden_size, 3584);
  EXPECT_EQ(v.patch_size, 14);
  EXPECT_EQ(c.conventions.mrope_section, (std::array<int64_t, 3>{16, 24, 24}));
}

TEST(Config, Qwen2_5VL7BInstruct) {
  const ModelConfig c = load_model_config(kConfigs + "hf/Qwen2.5-VL-7B-Instruct.json");
  EXPECT_EQ(c.text.max_position_embeddings, 128000);
  const QwenVisionConfig& v = *qwen_vision_of(c);
  EXPECT_EQ(v.hidden_size, 1280);
  EXPECT_EQ(v.intermediate_size, 3420);
  EXPECT_EQ(v.out_hidden_size, 3584);
  EXPECT_EQ(v.fullatt_block_indexes, (std::vector<int64_t>{7, 15, 23, 31}));
  EXPECT_EQ(c.conventions.tokens_per_second, 2.0);
}

TEST(Config, Qwen3VL8BInstruct) {
  const ModelConfig c = load_model_config(kConfigs + "hf/Qwen3-VL-8B-Instruct.json");
  EXPECT_EQ(c.text.vocab_size, 151936);
  EXPECT_EQ(c.text.hidden_size, 4096);
  EXPECT_EQ(c.text.intermediate_size, 12288);
  EXPECT_EQ(c.text.num_hidden_layers, 36);
  EXPECT_EQ(c.text.num_key_value_heads, 8);
  EXPECT_EQ(c.text.head_dim, 128);
  EXPECT_EQ(c.text.rope_theta, 5e6);
  EXPECT_EQ(c.text.max_position_embeddings, 262144);
  EXPECT_EQ(c.conventions.mrope_section, (std::array<int64_t, 3>{24, 20, 20}));
  EXPECT_TRUE(c.conventions.mrope_interleaved);
  const QwenVisionConfig& v = *qwen_vision_of(c);
  EXPECT_EQ(v.depth, 27);
  EXPECT_EQ(v.hidden_size, 1152);
  EXPECT_EQ(v.head_dim(), 72);
  EXPECT_EQ(v.out_hidden_size, 4096);
  EXPECT_EQ(v.num_position_embeddings, 2304);
  EXPECT_EQ(v.deepstack_visual_indexes, (std::vector<int64_t>{8, 16, 24}));
}

TEST(Config, Llava15With7BDefaultsFromTransformers) {
  // The released file leaves most Llama and some CLIP fields to transformers' defaults.
  const ModelConfig c = load_model_config(kConfigs + "hf/llava-1.5-7b-hf.json");
  EXPECT_EQ(c.text.vocab_size, 32064);
  EXPECT_EQ(c.text.hidden_size, 4096);
  EXPECT_EQ(c.text.intermediate_size, 11008);
  EXPECT_EQ(c.text.num_hidden_layers, 32);
  EXPECT_EQ(c.text.num_attention_heads, 32);
  EXPECT_EQ(c.text.num_key_value_heads, 32);
  EXPECT_EQ(c.text.head_dim, 128);
  EXPECT_EQ(c.text.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.text.max_position_embeddings, 4096);
  EXPECT_EQ(c.text.rope_theta, 10000.0);
  const ClipVisionConfig& v = *clip_vision_of(c);
  EXPECT_EQ(v.num_hidden_layers, 24);
  EXPECT_EQ(v.hidden_size, 1024);
  EXPECT_EQ(v.image_size, 336);
  EXPECT_EQ(v.patch_size, 14);
  EXPECT_EQ(v.hidden_act, "quick_gelu");
  EXPECT_EQ(v.layer_norm_eps, 1e-5);
  EXPECT_EQ(llava_projector_of(c)->image_seq_length, 576);
  EXPECT_EQ(llava_projector_of(c)->projector_hidden_act, "gelu");
  EXPECT_TRUE(llava_projector_of(c)->multimodal_projector_bias);
}

// ---------- hybrid decoders (qwen3_5) ----------

std::vector<LayerKind> kinds(const std::string& pattern) {  // "LLLF" -> linear ×3, full
  std::vector<LayerKind> out;
  for (char ch : pattern) out.push_back(ch == 'L' ? LayerKind::linear_attention : LayerKind::full_attention);
  return out;
}

TEST(Config, TinyQwen3_5VL) {
  const ModelConfig c = load_model_config(kConfigs + "tiny-qwen3_5-vl.json");
  EXPECT_EQ(c.model_type, "qwen3_5");
  EXPECT_EQ(c.conventions.name, "qwen3_vl");  // planned as Qwen3-VL: positions, placeholders
  EXPECT_EQ(c.text.model_type, "qwen3_5_text");
  EXPECT_EQ(c.text.layer_types, kinds("LLLF"));
  EXPECT_TRUE(c.text.is_hybrid());
  EXPECT_EQ(c.text.head_dim, 32);
  EXPECT_EQ(c.text.rotary_dim(), 8);
  EXPECT_EQ(c.text.rope_theta, 1e7);
  EXPECT_EQ(c.text.linear_num_key_heads, 2);
  EXPECT_EQ(c.text.linear_num_value_heads, 4);
  EXPECT_EQ(c.text.linear_key_head_dim, 16);
  EXPECT_EQ(c.text.linear_value_head_dim, 16);
  EXPECT_EQ(c.text.linear_conv_kernel_dim, 4);
  EXPECT_TRUE(c.text.linear_split_projections);
  EXPECT_TRUE(c.text.attn_output_gate);
  EXPECT_TRUE(c.text.zero_centered_norm);
  EXPECT_TRUE(c.text.qk_norm);
  EXPECT_FALSE(c.text.qkv_bias);
  EXPECT_EQ(c.conventions.mrope_section, (std::array<int64_t, 3>{2, 1, 1}));
  EXPECT_TRUE(c.conventions.mrope_interleaved);
  EXPECT_EQ(c.conventions.image_token_id, 248056);
  EXPECT_EQ(c.conventions.vision_start_token_id, 248053);
  const QwenVisionConfig& v = *qwen_vision_of(c);
  EXPECT_EQ(v.depth, 2);
  EXPECT_EQ(v.num_position_embeddings, 64);
  EXPECT_TRUE(v.deepstack_visual_indexes.empty());
}

// ---------- mixture of experts (qwen3_vl_moe, qwen3_5_moe) ----------

TEST(Config, TinyQwen3VLMoe) {
  const ModelConfig c = load_model_config(kConfigs + "tiny-qwen3-vl-moe.json");
  EXPECT_EQ(c.model_type, "qwen3_vl_moe");
  EXPECT_EQ(c.conventions.name, "qwen3_vl");  // planned as Qwen3-VL
  EXPECT_EQ(c.text.model_type, "qwen3_vl_moe_text");
  const MoeConfig& m = c.text.moe;
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.num_experts_per_tok, 2);
  EXPECT_EQ(m.moe_intermediate_size, 24);
  EXPECT_EQ(m.shared_expert_intermediate_size, 0);
  EXPECT_EQ(m.layout, ExpertLayout::fused);
  EXPECT_TRUE(m.aux_loss());
  EXPECT_EQ(m.router_aux_loss_coef, 0.01);
  // mlp_only_layers [1]: layer 1 dense, the others sparse
  EXPECT_TRUE(m.sparse(0));
  EXPECT_FALSE(m.sparse(1));
  EXPECT_TRUE(m.sparse(2));
  EXPECT_TRUE(m.sparse(3));
  EXPECT_EQ(c.text.intermediate_size, 128);  // the dense layer's MLP
  EXPECT_EQ(qwen_vision_of(c)->deepstack_visual_indexes, (std::vector<int64_t>{0, 1}));
}

TEST(Config, TinyQwen3_5Moe) {
  const ModelConfig c = load_model_config(kConfigs + "tiny-qwen3_5-moe.json");
  EXPECT_EQ(c.model_type, "qwen3_5_moe");
  EXPECT_EQ(c.conventions.name, "qwen3_vl");
  EXPECT_EQ(c.conventions.image_token_id, 248056);
  EXPECT_EQ(c.text.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.text.layer_types, kinds("LLLF"));
  const MoeConfig& m = c.text.moe;
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.shared_expert_intermediate_size, 48);
  EXPECT_EQ(m.layout, ExpertLayout::per_expert);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(m.sparse(i)) << i;
}

// The released Qwen3-VL-30B-A3B-Instruct config.json, and Qwen3_5MoeTextConfig's and
// Qwen3VLMoeTextConfig's defaults where a file is silent.
TEST(Config, Qwen3VL30BA3BAndMoeDefaults) {
  const ModelConfig c = load_model_config(kConfigs + "hf/Qwen3-VL-30B-A3B-Instruct.json");
  EXPECT_EQ(c.text.num_hidden_layers, 48);
  EXPECT_EQ(c.text.hidden_size, 2048);
  EXPECT_EQ(c.text.moe.num_experts, 128);
  EXPECT_EQ(c.text.moe.num_experts_per_tok, 8);
  EXPECT_EQ(c.text.moe.moe_intermediate_size, 768);
  EXPECT_FALSE(c.text.moe.aux_loss());  // output_router_logits: not set, false
  EXPECT_EQ(c.text.moe.router_aux_loss_coef, 0.001);
  EXPECT_EQ(c.text.num_key_value_heads, 4);
  EXPECT_EQ(qwen_vision_of(c)->depth, 27);
  const ModelConfig vl =
      parse_model_config({{"model_type", "qwen3_vl_moe"}, {"vision_config", {{"out_hidden_size", 2048}}}});
  EXPECT_EQ(vl.text.moe.num_experts, 60);
  EXPECT_EQ(vl.text.moe.num_experts_per_tok, 4);
  EXPECT_EQ(vl.text.moe.moe_intermediate_size, 1408);
  EXPECT_EQ(vl.text.num_hidden_layers, 24);
  EXPECT_EQ(vl.text.head_dim, 128);  // hidden_size 2048 / 16 heads
  EXPECT_EQ(vl.text.rope_theta, 500000.0);
  // transformers 5 writes Qwen3-VL-MoE's num_experts as num_local_experts (its attribute_map)
  const nlohmann::json v5 = {{"model_type", "qwen3_vl_moe"},
                             {"text_config", {{"num_local_experts", 8}, {"num_experts_per_tok", 2}}},
                             {"vision_config", {{"out_hidden_size", 2048}}}};
  EXPECT_EQ(parse_model_config(v5).text.moe.num_experts, 8);
  // ... and text_config.tie_word_embeddings true (its class default) beside the top-level
  // false that transformers ties by
  nlohmann::json tied_text = v5;
  tied_text["text_config"]["tie_word_embeddings"] = true;
  tied_text["tie_word_embeddings"] = false;
  EXPECT_FALSE(parse_model_config(tied_text).tie_word_embeddings);
  nlohmann::json both = v5;
  both["text_config"]["num_experts"] = 16;
  EXPECT_THAT(error_of(both), HasSubstr("text_config.num_local_experts (8) differs from text_config.num_experts (16)"));
  const ModelConfig q =
      parse_model_config({{"model_type", "qwen3_5_moe"}, {"vision_config", {{"out_hidden_size", 2048}}}});
  EXPECT_EQ(q.text.moe.num_experts, 256);
  EXPECT_EQ(q.text.moe.num_experts_per_tok, 8);
  EXPECT_EQ(q.text.moe.moe_intermediate_size, 512);
  EXPECT_EQ(q.text.moe.shared_expert_intermediate_size, 512);
  EXPECT_EQ(q.text.num_hidden_layers, 40);
  EXPECT_EQ(q.text.num_key_value_heads, 2);
  EXPECT_EQ(q.conventions.image_token_id, 248056);
}

TEST(Config, ExpertShardsSplitTheExperts) {
  MoeConfig m = load_model_config(kConfigs + "tiny-qwen3-vl-moe.json").text.moe;
  set_expert_shard(m, 4, 3);
  EXPECT_EQ(m.local_experts(), 2);
  EXPECT_EQ(m.first_local_expert(), 6);
  try {
    set_expert_shard(m, 3, 0);
    FAIL() << "--expert 3 does not divide 8 experts";
  } catch (const Error& e) { EXPECT_THAT(e.what(), HasSubstr("--expert 3 must divide num_experts (8)")); }
}

TEST(Config, Qwen3_5_08B) {
  const ModelConfig c = load_model_config(kConfigs + "hf/Qwen3.5-0.8B.json");
  EXPECT_EQ(c.text.vocab_size, 248320);
  EXPECT_EQ(c.text.hidden_size, 1024);
  EXPECT_EQ(c.text.num_hidden_layers, 24);
  EXPECT_EQ(c.text.layer_types, kinds("LLLFLLLFLLLFLLLFLLLFLLLF"));
  EXPECT_EQ(c.text.num_attention_heads, 8);
  EXPECT_EQ(c.text.num_key_value_heads, 2);
  EXPECT_EQ(c.text.head_dim, 256);
  EXPECT_EQ(c.text.rotary_dim(), 64);
  EXPECT_EQ(c.text.linear_num_key_heads, 16);
  EXPECT_EQ(c.text.linear_num_value_heads, 16);
  EXPECT_EQ(c.text.linear_key_head_dim, 128);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.conventions.mrope_section, (std::array<int64_t, 3>{11, 11, 10}));
  EXPECT_EQ(c.conventions.video_token_id, 248057);
  EXPECT_EQ(qwen_vision_of(c)->depth, 12);
  EXPECT_EQ(qwen_vision_of(c)->out_hidden_size, 1024);
  EXPECT_TRUE(qwen_vision_of(c)->deepstack_visual_indexes.empty());
}

TEST(ConfigDefaults, Qwen3_5TakesQwen3_5TextConfigDefaults) {
  // Qwen3_5TextConfig: 32 layers, every 4th full attention, H_k 16, H_v 32, K = V = 128,
  // head_dim 256 of which 64 rotate, mRoPE [11, 11, 10]; Qwen3_5Config's token ids.
  const ModelConfig c = parse_model_config({{"model_type", "qwen3_5"}, {"vision_config", {{"out_hidden_size", 4096}}}});
  EXPECT_EQ(c.text.vocab_size, 248320);
  EXPECT_EQ(c.text.hidden_size, 4096);
  EXPECT_EQ(c.text.num_hidden_layers, 32);
  EXPECT_EQ(c.text.num_key_value_heads, 4);
  EXPECT_EQ(c.text.head_dim, 256);
  EXPECT_EQ(c.text.rotary_dim(), 64);
  EXPECT_EQ(c.text.layer_types, kinds("LLLFLLLFLLLFLLLFLLLFLLLFLLLFLLLF"));
  EXPECT_EQ(c.text.linear_num_key_heads, 16);
  EXPECT_EQ(c.text.linear_num_value_heads, 32);
  EXPECT_EQ(c.text.linear_key_head_dim, 128);
  EXPECT_EQ(c.text.linear_value_head_dim, 128);
  EXPECT_EQ(c.text.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.conventions.mrope_section, (std::array<int64_t, 3>{11, 11, 10}));
  EXPECT_EQ(c.conventions.image_token_id, 248056);
  EXPECT_EQ(c.conventions.video_token_id, 248057);
  EXPECT_EQ(c.conventions.vision_end_token_id, 248054);
  EXPECT_EQ(qwen_vision_of(c)->depth, 27);
  EXPECT_TRUE(qwen_vision_of(c)->deepstack_visual_indexes.empty());  // Qwen3.5 has no deepstack
}

TEST(ConfigDefaults, HybridLayerKinds) {
  json c = read_json(kConfigs + "tiny-qwen3_5-vl.json");
  // Without layer_types: layer i is full iff (i + 1) % full_attention_interval == 0.
  json t = without(c, "/text_config/layer_types");
  EXPECT_EQ(parse_model_config(t).text.layer_types, kinds("LLLF"));
  EXPECT_EQ(parse_model_config(with(t, "/text_config/full_attention_interval", 2)).text.layer_types, kinds("LFLF"));
  EXPECT_EQ(parse_model_config(with(t, "/text_config/full_attention_interval", 1)).text.layer_types, kinds("FFFF"));
  // layer_types wins over the interval, and transformers' legacy names are read.
  json legacy = with(c, "/text_config/layer_types", json({"mamba", "attention", "linear_attention", "full_attention"}));
  EXPECT_EQ(parse_model_config(legacy).text.layer_types, kinds("LFLF"));
  // partial_rotary_factor: rope_parameters, else the top level of text_config, else 0.25.
  json p = without(c, "/text_config/rope_parameters/partial_rotary_factor");
  p["text_config"]["partial_rotary_factor"] = 0.5;
  p["text_config"]["rope_parameters"]["mrope_section"] = {4, 2, 2};
  EXPECT_EQ(parse_model_config(p).text.rotary_dim(), 16);
  // Qwen3-Next's layout: fused projections, dense MLP only.
  json next = with(c, "/text_config/model_type", "qwen3_next");
  next["text_config"]["num_experts"] = 0;
  EXPECT_FALSE(parse_model_config(next).text.linear_split_projections);
  next["text_config"]["num_experts"] = 8;
  next["text_config"]["mlp_only_layers"] = {0, 1, 2, 3};
  EXPECT_EQ(parse_model_config(next).text.model_type, "qwen3_next");
}

// ---------- defaults ----------

TEST(ConfigDefaults, MissingFieldsTakeTransformersDefaults) {
  // Only model_type: every field comes from the family's config class.
  const ModelConfig q2 = parse_model_config({{"model_type", "qwen2_vl"},
                                             {"hidden_size", 3584},
                                             {"num_attention_heads", 28},
                                             {"num_key_value_heads", 4},
                                             {"vision_config", {{"hidden_size", 3584}}}});
  EXPECT_EQ(q2.text.vocab_size, 152064);
  EXPECT_EQ(q2.text.num_hidden_layers, 80);
  EXPECT_EQ(q2.text.rms_norm_eps, 1e-5);
  EXPECT_EQ(qwen_vision_of(q2)->depth, 32);
  EXPECT_EQ(qwen_vision_of(q2)->hidden_size, 1280);
  EXPECT_EQ(qwen_vision_of(q2)->intermediate_size, 5120);

  const ModelConfig q3 =
      parse_model_config({{"model_type", "qwen3_vl"}, {"vision_config", {{"out_hidden_size", 4096}}}});
  EXPECT_EQ(q3.text.hidden_size, 4096);
  EXPECT_EQ(q3.text.num_key_value_heads, 32);
  EXPECT_EQ(q3.text.head_dim, 128);
  EXPECT_EQ(q3.text.max_position_embeddings, 128000);
  EXPECT_EQ(qwen_vision_of(q3)->depth, 27);
  EXPECT_EQ(qwen_vision_of(q3)->num_position_embeddings, 2304);
  EXPECT_EQ(q3.conventions.mrope_section, (std::array<int64_t, 3>{24, 20, 20}));

  // LLaVA with neither sub-config: Llama-7B and CLIP ViT-L/14 at 336 px. Llama's 32000-row
  // vocabulary has no row for the <image> token (32000): llava-1.5 adds 64 rows.
  EXPECT_THAT(error_of({{"model_type", "llava"}}),
              HasSubstr("image_token_index (32000) must be < the decoder's vocab_size (32000)"));
  const ModelConfig l = parse_model_config({{"model_type", "llava"}, {"text_config", {{"vocab_size", 32064}}}});
  EXPECT_EQ(l.text.hidden_size, 4096);
  EXPECT_EQ(l.text.max_position_embeddings, 2048);
  EXPECT_EQ(clip_vision_of(l)->hidden_size, 1024);
  EXPECT_EQ(clip_vision_of(l)->num_patches(), 576);
  // A vision_config that is present takes CLIPVisionConfig's own defaults for missing keys.
  const ModelConfig l2 = parse_model_config(
      {{"model_type", "llava"}, {"text_config", {{"vocab_size", 32064}}}, {"vision_config", json::object()}});
  EXPECT_EQ(clip_vision_of(l2)->hidden_size, 768);
  EXPECT_EQ(clip_vision_of(l2)->patch_size, 32);
}

TEST(ConfigDefaults, NullMeansDefaultAndNullKvHeadsMeansMha) {
  json c = read_json(kConfigs + "tiny-qwen2-vl.json");
  c["num_key_value_heads"] = nullptr;
  c["rms_norm_eps"] = nullptr;
  const ModelConfig m = parse_model_config(c);
  EXPECT_EQ(m.text.num_key_value_heads, 4);
  EXPECT_EQ(m.text.rms_norm_eps, 1e-5);
}

TEST(ConfigDefaults, NestedTextConfigAndRopeParameters) {
  // Newer transformers write Qwen2-VL's decoder under text_config and rope_parameters.
  json c = read_json(kConfigs + "tiny-qwen2-vl.json");
  json text = {{"model_type", "qwen2_vl_text"},
               {"hidden_size", 64},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"num_hidden_layers", 3},
               {"vocab_size", 151936},
               {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 12345.0}, {"mrope_section", {4, 2, 2}}}}};
  c = without(c, "/rope_scaling");
  c["text_config"] = text;
  const ModelConfig m = parse_model_config(c);
  EXPECT_EQ(m.text.num_hidden_layers, 3);
  EXPECT_EQ(m.text.rope_theta, 12345.0);
  EXPECT_EQ(m.conventions.mrope_section, (std::array<int64_t, 3>{4, 2, 2}));
}

TEST(ConfigDefaults, TieWordEmbeddingsFromTopOrText) {
  json c = read_json(kConfigs + "tiny-llava.json");
  EXPECT_FALSE(parse_model_config(c).tie_word_embeddings);
  EXPECT_TRUE(parse_model_config(with(c, "/text_config/tie_word_embeddings", true)).tie_word_embeddings);
  EXPECT_TRUE(parse_model_config(with(c, "/tie_word_embeddings", true)).tie_word_embeddings);
}

// ---------- errors name the field ----------

struct BadValue {
  std::string file;
  std::string pointer;  // JSON pointer into the file
  json value;
  std::string message;
};

void PrintTo(const BadValue& b, std::ostream* os) { *os << b.file << " " << b.pointer << " = " << b.value.dump(); }

class ConfigErrors : public testing::TestWithParam<BadValue> {};

TEST_P(ConfigErrors, NameTheFieldAndValue) {
  const BadValue& b = GetParam();
  const json c = with(read_json(kConfigs + b.file), b.pointer, b.value);
  EXPECT_THAT(error_of(c), HasSubstr(b.message)) << b.file << " " << b.pointer;
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ConfigErrors,
    testing::Values(
        BadValue{"tiny-qwen2-vl.json", "/num_attention_heads", 5,
                 "num_attention_heads (5) must divide hidden_size (64)"},
        BadValue{"tiny-qwen2-vl.json", "/num_key_value_heads", 3,
                 "num_key_value_heads (3) must divide num_attention_heads (4)"},
        BadValue{"tiny-qwen3-vl.json", "/text_config/num_key_value_heads", 3,
                 "text_config.num_key_value_heads (3) must divide text_config.num_attention_heads (4)"},
        BadValue{"tiny-qwen2-vl.json", "/rope_scaling/mrope_section", json({2, 2, 2}),
                 "rope_scaling.mrope_section [2, 2, 2] sums to 6 but must be head_dim / 2 = 16 / 2"},
        BadValue{"tiny-qwen3-vl.json", "/text_config/rope_scaling/mrope_section", json({4, 3, 3}),
                 "text_config.rope_scaling.mrope_section [4, 3, 3] sums to 10"},
        BadValue{"tiny-qwen3-vl.json", "/text_config/head_dim", 15, "text_config.head_dim (15) must be even"},
        BadValue{"tiny-qwen3-vl.json", "/text_config/rope_scaling/mrope_interleaved", false,
                 "text_config.rope_scaling.mrope_interleaved is false, but qwen3_vl always interleaves"},
        BadValue{"tiny-qwen3-vl.json", "/text_config/rope_scaling/mrope_interleaved", "yes",
                 "text_config.rope_scaling.mrope_interleaved must be true or false, got \"yes\""},
        BadValue{"tiny-qwen2-vl.json", "/vision_config/spatial_merge_size", 0,
                 "vision_config.spatial_merge_size must be an integer >= 1, got 0"},
        BadValue{"tiny-qwen2-vl.json", "/vision_config/num_heads", 3,
                 "vision_config.num_heads (3) must divide vision_config.embed_dim (32)"},
        BadValue{"tiny-qwen2-vl.json", "/vision_config/num_heads", 16,
                 "vision_config.embed_dim / vision_config.num_heads = 32 / 16 = 2 must be a multiple of 4"},
        BadValue{"tiny-qwen2-vl.json", "/vision_config/hidden_size", 48,
                 "vision_config.hidden_size (48) must equal the decoder's hidden_size (64)"},
        BadValue{"tiny-qwen3-vl.json", "/vision_config/out_hidden_size", 48,
                 "vision_config.out_hidden_size (48) must equal the decoder's text_config.hidden_size (64)"},
        BadValue{"tiny-qwen2-vl.json", "/vision_config/in_channels", 4,
                 "vision_config.in_channels (4) and vision_config.in_chans (3) disagree"},
        BadValue{"tiny-qwen2-vl.json", "/vision_config/mlp_ratio", -1,
                 "vision_config.mlp_ratio must be a number > 0, got -1"},
        BadValue{"tiny-qwen2-vl.json", "/vision_config/hidden_act", "swish",
                 "vision_config.hidden_act \"swish\" is not supported"},
        BadValue{"tiny-qwen2-vl.json", "/vocab_size", 1000,
                 "image_token_id (151655) must be < the decoder's vocab_size (1000)"},
        BadValue{"tiny-qwen2-vl.json", "/hidden_size", "64", "hidden_size must be an integer >= 1, got \"64\""},
        BadValue{"tiny-qwen2-vl.json", "/rms_norm_eps", 0, "rms_norm_eps must be a number > 0, got 0"},
        BadValue{"tiny-qwen2-vl.json", "/rope_theta", -1.0, "rope_theta must be a number > 0, got -1.0"},
        BadValue{"tiny-qwen2-vl.json", "/use_sliding_window", true,
                 "use_sliding_window is true; sliding-window attention is not supported"},
        BadValue{"tiny-qwen2-vl.json", "/rope_scaling/type", "yarn", "rope_scaling.type \"yarn\" is not supported"},
        BadValue{"tiny-qwen2-vl.json", "/vision_config", 3, "vision_config must be an object, got number"},
        BadValue{"tiny-qwen2_5-vl.json", "/vision_config/window_size", 100,
                 "vision_config.window_size (100) must be a multiple of patch_size * spatial_merge_size (14 * 2 = 28)"},
        BadValue{"tiny-qwen2_5-vl.json", "/vision_config/fullatt_block_indexes", json({0, 2}),
                 "vision_config.fullatt_block_indexes [0, 2] names block 2, but vision_config.depth is 2"},
        BadValue{"tiny-qwen3-vl.json", "/vision_config/deepstack_visual_indexes", json({1, 0}),
                 "vision_config.deepstack_visual_indexes [1, 0] must be strictly increasing"},
        BadValue{"tiny-qwen3-vl.json", "/vision_config/deepstack_visual_indexes", json({0, 3}),
                 "vision_config.deepstack_visual_indexes [0, 3] names block 3, but vision_config.depth is 3"},
        BadValue{"tiny-qwen3-vl.json", "/vision_config/deepstack_visual_indexes", json({-1}),
                 "vision_config.deepstack_visual_indexes must be a list of integers >= 0, got [-1]"},
        BadValue{"tiny-qwen3-vl.json", "/text_config/num_hidden_layers", 1,
                 "feeds 2 decoder layers, but text_config.num_hidden_layers is 1"},
        BadValue{"tiny-qwen3-vl.json", "/vision_config/num_position_embeddings", 60,
                 "vision_config.num_position_embeddings (60) must be a square"},
        BadValue{"tiny-qwen3-vl.json", "/text_config/model_type", "qwen3_vl_moe_text",
                 "text_config.model_type \"qwen3_vl_moe_text\" is not supported for qwen3_vl"},
        BadValue{"tiny-qwen3-vl.json", "/text_config", "x", "text_config must be an object, got string"},
        BadValue{"tiny-llava.json", "/text_config/model_type", "mistral",
                 "text_config.model_type \"mistral\" is not supported for llava; expected \"llama\""},
        BadValue{"tiny-llava.json", "/vision_config/model_type", "siglip_vision_model",
                 "vision_config.model_type \"siglip_vision_model\" is not supported for llava"},
        BadValue{"tiny-llava.json", "/vision_config/patch_size", 15,
                 "vision_config.patch_size (15) must divide vision_config.image_size (56)"},
        BadValue{"tiny-llava.json", "/vision_config/num_attention_heads", 3,
                 "vision_config.num_attention_heads (3) must divide vision_config.hidden_size (32)"},
        BadValue{"tiny-llava.json", "/vision_feature_layer", -4, "vision_feature_layer (-4) must be in [-3, 2]"},
        BadValue{"tiny-llava.json", "/vision_feature_layer", json({-2, -1}),
                 "vision_feature_layer [-2,-1]: a list of layers is not supported"},
        BadValue{"tiny-llava.json", "/vision_feature_select_strategy", "cls",
                 "vision_feature_select_strategy \"cls\" is not supported"},
        BadValue{"tiny-llava.json", "/projector_hidden_act", "tanh", "projector_hidden_act \"tanh\" is not supported"},
        BadValue{"tiny-llava.json", "/image_seq_length", 576,
                 "image_seq_length (576) must equal the rows the encoder yields per image: (image_size / patch_size)^2 "
                 "= (56 / 14)^2 = 16"},
        BadValue{"tiny-llava.json", "/text_config/rope_scaling", json({{"rope_type", "llama3"}, {"factor", 8.0}}),
                 "text_config.rope_scaling.rope_type \"llama3\" is not supported"},
        BadValue{"tiny-llava.json", "/image_token_index", 40000,
                 "image_token_index (40000) must be < the decoder's vocab_size (32064)"},
        BadValue{"tiny-llava.json", "/text_config/intermediate_size", 0,
                 "text_config.intermediate_size must be an integer >= 1, got 0"},
        BadValue{"tiny-qwen2-vl.json", "/vision_config/patch_size", 2147483648LL,
                 "vision_config.patch_size must be an integer <= 2147483647, got 2147483648"},
        BadValue{"tiny-qwen2-vl.json", "/rms_norm_eps", 1e300 * 1e10, "rms_norm_eps must be a number > 0"},
        BadValue{"tiny-qwen2-vl.json", "/rope_scaling/mrope_section", json({INT64_MAX, 1, 0}),
                 "sums to more than 2^63 but must be head_dim / 2"},
        BadValue{"tiny-qwen3-vl.json", "/vision_config/deepstack_visual_indexes", json({0, 4294967296LL}),
                 "deepstack_visual_indexes must be a list of integers <= 2147483647, got [0,4294967296]"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/layer_types/2", "sliding_attention",
                 "text_config.layer_types[2] is \"sliding_attention\"; supported layer kinds: \"linear_attention\""},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/layer_types/4", "full_attention",
                 "text_config.layer_types has 5 entries but text_config.num_hidden_layers is 4"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/layer_types", "linear_attention",
                 "text_config.layer_types must be a list of layer kinds, got \"linear_attention\""},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/full_attention_interval", 0,
                 "text_config.full_attention_interval must be an integer >= 1, got 0"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/linear_num_value_heads", 3,
                 "text_config.linear_num_value_heads (3) must be a multiple of text_config.linear_num_key_heads (2)"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/linear_num_key_heads", 0,
                 "text_config.linear_num_key_heads must be an integer >= 1, got 0"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/linear_key_head_dim", "16",
                 "text_config.linear_key_head_dim must be an integer >= 1, got \"16\""},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/linear_conv_kernel_dim", 0,
                 "text_config.linear_conv_kernel_dim must be an integer >= 1, got 0"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/linear_value_head_dim", -2,
                 "text_config.linear_value_head_dim must be an integer >= 1, got -2"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/num_key_value_heads", 3,
                 "text_config.num_key_value_heads (3) must divide text_config.num_attention_heads (4)"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/model_type", "qwen3_5_moe_text",
                 "text_config.model_type \"qwen3_5_moe_text\" is not supported for qwen3_5; expected \"qwen3_5_text\" "
                 "or \"qwen3_next\" (a mixture-of-experts decoder: model_type qwen3_5_moe)"},
        // ---- mixture of experts (qwen3_vl_moe, qwen3_5_moe) ----
        BadValue{"tiny-qwen3-vl-moe.json", "/text_config/num_experts_per_tok", 9,
                 "text_config.num_experts_per_tok (9) must be at most text_config.num_experts (8)"},
        BadValue{"tiny-qwen3-vl-moe.json", "/text_config/num_experts", 0,
                 "text_config.num_experts must be an integer >= 1, got 0"},
        BadValue{"tiny-qwen3-vl-moe.json", "/text_config/mlp_only_layers", json({1, 4}),
                 "text_config.mlp_only_layers lists layer 4, but the decoder has 4 layers (0 to 3)"},
        BadValue{"tiny-qwen3-vl-moe.json", "/text_config/decoder_sparse_step", 0,
                 "text_config.decoder_sparse_step must be an integer >= 1, got 0"},
        BadValue{"tiny-qwen3-vl-moe.json", "/text_config/norm_topk_prob", false,
                 "text_config.norm_topk_prob is false, but transformers' router always renormalises"},
        BadValue{"tiny-qwen3-vl-moe.json", "/text_config/router_aux_loss_coef", -1,
                 "text_config.router_aux_loss_coef must be a number >= 0, got -1"},
        BadValue{"tiny-qwen3-vl-moe.json", "/text_config/model_type", "qwen3_vl_text",
                 "text_config.model_type \"qwen3_vl_text\" is not supported for qwen3_vl_moe; expected "
                 "\"qwen3_vl_moe_text\""},
        BadValue{"tiny-qwen3_5-moe.json", "/text_config/mlp_only_layers", json({0}),
                 "text_config.mlp_only_layers lists 1 layer(s), but every layer of this model is a mixture of experts"},
        BadValue{"tiny-qwen3_5-moe.json", "/text_config/decoder_sparse_step", 2,
                 "text_config.decoder_sparse_step is 2, but every layer of this model is a mixture of experts"},
        BadValue{"tiny-qwen3_5-moe.json", "/text_config/shared_expert_intermediate_size", 0,
                 "text_config.shared_expert_intermediate_size must be an integer >= 1, got 0"},
        BadValue{
            "tiny-qwen3_5-moe.json", "/text_config/model_type", "qwen3_5_text",
            "text_config.model_type \"qwen3_5_text\" is not supported for qwen3_5_moe; expected \"qwen3_5_moe_text\""},
        BadValue{"tiny-qwen3_5-moe.json", "/vision_config/model_type", "qwen3_vl",
                 "vision_config.model_type \"qwen3_vl\" is not supported for qwen3_5"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/model_type", "qwen3_next",
                 "text_config.num_experts is 512 (not set; default), so layer 0's MLP is a mixture of experts, which "
                 "is not supported"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/hidden_act", "gelu",
                 "text_config.hidden_act \"gelu\" is not supported for qwen3_5_text: the MLP and the Gated DeltaNet "
                 "conv are built with silu"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/attn_output_gate", false,
                 "text_config.attn_output_gate is false, but qwen3_5_text's attention always gates its output"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/rope_parameters/rope_type", "yarn",
                 "text_config.rope_parameters.rope_type \"yarn\" is not supported"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/rope_parameters/partial_rotary_factor", 1.5,
                 "text_config.rope_parameters.partial_rotary_factor must be in (0, 1], got 1.5"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/rope_parameters/partial_rotary_factor", 0.1,
                 "text_config.rope_parameters.partial_rotary_factor (0.1) times text_config.head_dim (32) gives 3 "
                 "rotary channels"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/rope_parameters/mrope_section", json({2, 2, 2}),
                 "text_config.rope_parameters.mrope_section [2, 2, 2] sums to 6 but must be the rotary channels / 2 = "
                 "int(head_dim · partial_rotary_factor) / 2 = 8 / 2"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/rope_parameters/mrope_interleaved", false,
                 "mrope_interleaved is false, but qwen3_5 always interleaves"},
        BadValue{"tiny-qwen3_5-vl.json", "/vision_config/deepstack_visual_indexes", json({0}),
                 "vision_config.deepstack_visual_indexes [0] must be empty: Qwen3.5's vision tower has no deepstack "
                 "mergers"},
        BadValue{"tiny-qwen3_5-vl.json", "/vision_config/model_type", "qwen3_vl",
                 "vision_config.model_type \"qwen3_vl\" is not supported for qwen3_5; expected \"qwen3_5_vision\""},
        BadValue{"tiny-qwen3_5-vl.json", "/vision_config/rope_parameters/rope_theta", 500.0,
                 "vision_config.rope_parameters.rope_theta (500) is not supported"},
        BadValue{"tiny-qwen3_5-vl.json", "/vision_config/out_hidden_size", 48,
                 "vision_config.out_hidden_size (48) must equal the decoder's text_config.hidden_size (64)"},
        BadValue{"tiny-qwen3_5-vl.json", "/text_config/vocab_size", 1000,
                 "image_token_id (248056) must be < the decoder's vocab_size (1000)"}),
    [](const testing::TestParamInfo<BadValue>& info) {
      // e.g. 3_qwen3_vl_text_config_num_key_value_heads
      std::string name = std::to_string(info.index) + "_" + info.param.file.substr(5, info.param.file.size() - 10) +
                         info.param.pointer;
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

TEST(ConfigErrorsTop, ModelTypeAndShape) {
  EXPECT_THAT(error_of(json::array()), HasSubstr("config.json: the top level must be a JSON object, got array"));
  EXPECT_THAT(error_of(json::object()), HasSubstr("config.json: model_type is missing"));
  EXPECT_THAT(error_of({{"model_type", "qwen3_moe"}}),
              HasSubstr("config.json: model_type \"qwen3_moe\" is not supported by the model layer"));
  // The family registry's one table lists every model_type, InternVL's among them.
  EXPECT_THAT(
      error_of({{"model_type", "qwen3_moe"}}),
      HasSubstr("supported: qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_vl_moe, qwen3_5_moe, llava, internvl"));
  EXPECT_THAT(error_of({{"model_type", "qwen3_next"}}),
              HasSubstr("config.json: model_type \"qwen3_next\" is a text-only checkpoint"));
  EXPECT_THAT(error_of({{"model_type", 3}}), HasSubstr("model_type must be a string, got 3"));
  // Errors from the planner's conventions come through with the source named once.
  const json c = with(read_json(kConfigs + "tiny-qwen2-vl.json"), "/video_token_id", 151655);
  EXPECT_THAT(error_of(c), HasSubstr("config.json: image, video, vision start and vision end "
                                     "token ids must differ"));
  EXPECT_THAT(error_of(c), ::testing::Not(HasSubstr("config.json: config.json")));
}

TEST(ConfigErrorsTop, FilesNameThePath) {
  EXPECT_THAT(
      [] {
        try {
          load_model_config("/nonexistent/config.json");
        } catch (const Error& e) { return std::string(e.what()); }
        return std::string();
      }(),
      HasSubstr("/nonexistent/config.json: cannot open model config"));
  const std::string bad = testing::TempDir() + "mmsp_bad_config.json";
  std::ofstream(bad) << "{\"model_type\": ";
  try {
    load_model_config(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) { EXPECT_THAT(e.what(), HasSubstr(bad + ": not valid JSON")); }
}

}  // namespace
}  // namespace mmsp::model
