// The language decoder's config (Qwen2-VL / Qwen2.5-VL / Qwen3-VL text, LLaVA's Llama, and
// the hybrid Qwen3.5 / Qwen3-Next text configs that mix full attention with Gated DeltaNet
// layers), typed and validated. Defaults are what Hugging Face transformers uses when a key is
// missing, so a config.json means the same model here as there. mRoPE sections live in
// plan::ModelConventions (the planner needs them too); ModelConfig checks them against head_dim.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/model/config/moe_config.h"
#include "mmsp/plan/attention_cost.h"
#include "mmsp/plan/model_conventions.h"

namespace mmsp::model {

// The token mixer of one decoder layer (Hugging Face's layer_types entries).
enum class LayerKind { full_attention, linear_attention };
const char* to_string(LayerKind kind);

struct TextConfig {
  // HF model_type of the decoder: "qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "llama",
  // "qwen3_5_text", "qwen3_next"
  std::string model_type = "qwen2_vl_text";
  // rows of the token embedding and of the LM head
  int64_t vocab_size = 152064;
  // width of the residual stream
  int64_t hidden_size = 8192;
  // width of the SwiGLU MLP's gate/up projections
  int64_t intermediate_size = 29568;
  // decoder layers
  int64_t num_hidden_layers = 80;
  // query heads
  int64_t num_attention_heads = 64;
  // key/value heads (GQA); must divide num_attention_heads
  int64_t num_key_value_heads = 8;
  // size of one head; hidden_size / num_attention_heads unless the config sets it (Qwen3-VL)
  int64_t head_dim = 128;
  // MLP activation (the SwiGLU gate): "silu" in every supported model
  std::string hidden_act = "silu";
  // epsilon of every RMSNorm
  double rms_norm_eps = 1e-5;
  // RoPE base frequency (rope_theta, or rope_parameters.rope_theta in newer files)
  double rope_theta = 1000000.0;
  // longest sequence the positions were trained for
  int64_t max_position_embeddings = 32768;
  // q/k/v projections carry a bias (always in Qwen2/2.5-VL; attention_bias in Llama/Qwen3-VL)
  bool qkv_bias = true;
  // the output projection carries a bias (attention_bias in Llama/Qwen3-VL; never in Qwen2)
  bool o_bias = false;
  // MLP projections carry a bias (Llama's mlp_bias; never in Qwen)
  bool mlp_bias = false;
  // RMSNorm on each query and key head before RoPE (Qwen3-VL)
  bool qk_norm = false;
  // std of the normal initialisation of weights trained from scratch
  double initializer_range = 0.02;

  // ---- hybrid decoders (qwen3_5_text, qwen3_next); the defaults below keep the others plain ----
  // token mixer of each layer (layer_types, or every full_attention_interval-th layer full);
  // empty: every layer full attention
  std::vector<LayerKind> layer_types;
  // Gated DeltaNet key heads H_k (linear_num_key_heads)
  int64_t linear_num_key_heads = 16;
  // Gated DeltaNet value heads H_v, a multiple of H_k (linear_num_value_heads)
  int64_t linear_num_value_heads = 32;
  // Gated DeltaNet key head size K (linear_key_head_dim)
  int64_t linear_key_head_dim = 128;
  // Gated DeltaNet value head size V (linear_value_head_dim)
  int64_t linear_value_head_dim = 128;
  // causal depthwise conv kernel W over q|k|v (linear_conv_kernel_dim)
  int64_t linear_conv_kernel_dim = 4;
  // Qwen3.5 keeps the GDN input projections apart (in_proj_qkv, in_proj_z, in_proj_b,
  // in_proj_a); Qwen3-Next fuses them, grouped by key head (in_proj_qkvz, in_proj_ba)
  bool linear_split_projections = false;
  // share of head_dim that RoPE rotates: the first rotary_dim() channels of each head
  // (rope_parameters.partial_rotary_factor; 0.25 in Qwen3.5 / Qwen3-Next)
  double partial_rotary_factor = 1.0;
  // q_proj yields [query | gate] per head and the attention output is multiplied by
  // sigmoid(gate) before o_proj (Qwen3.5 / Qwen3-Next always; attn_output_gate)
  bool attn_output_gate = false;
  // every RMSNorm of the decoder (not the GDN's gated norm) scales by (1 + weight), its
  // weight stored as an offset from 1 (Qwen3.5 / Qwen3-Next)
  bool zero_centered_norm = false;

  // ---- mixture-of-experts decoders (qwen3_vl_moe_text, qwen3_5_moe_text); none by default ----
  MoeConfig moe;

  // channels RoPE rotates: int(head_dim · partial_rotary_factor), as transformers computes it
  int64_t rotary_dim() const;
  LayerKind layer_kind(int64_t layer) const;
  bool is_hybrid() const { return !layer_types.empty(); }
};

// One decoder class a family's text_config may be: transformers' defaults for it (its
// model_type among them) and the two rules in which the classes differ.
struct TextVariant {
  TextConfig defaults;
  // head_dim left out: defaults.head_dim (Qwen3's 128, whatever the width); else
  // hidden_size / num_attention_heads
  bool head_dim_fixed = false;
  // Qwen2's attention: biases wired on q/k/v and none on o (attention_bias is not read),
  // no sliding window (use_sliding_window refused). Else attention_bias sets all four.
  bool qwen2_attention = false;
};

// How a family's decoder config reads. Each family declares its own, in its folder
// (model/families/<name>/), and hands it to parse_text_config: this file knows no family.
struct TextDialect {
  std::string family;  // for messages: "qwen2_vl", "llava", ...
  // chosen by text_config.model_type; the first when the config names none
  std::vector<TextVariant> variants;
  // num_key_value_heads left out: as many as the query heads (LlamaConfig); else the
  // variant's default. A null value means the same in every family.
  bool kv_heads_default_to_heads = false;
  // rope_scaling / rope_parameters "type" / "rope_type" values accepted, and the rule for
  // the message ("Llama decoders use plain RoPE (\"default\")")
  std::vector<std::string> rope_types;
  std::string rope_rule;
  // rope keys refused, and why ("InternVL's decoder uses 1-D RoPE")
  std::vector<std::string> refused_rope_keys;
  std::string refused_rope_reason;
  bool reads_mlp_bias = false;  // LlamaConfig's mlp_bias
};

// Reads the decoder fields of `text` (the top-level object for Qwen2/2.5-VL files without
// text_config, else text_config) in the family's dialect. `where` prefixes field names in
// errors ("text_config."). Checks the fields and the rules between them (heads divide
// hidden_size when head_dim is derived, kv heads divide heads, head_dim even for RoPE);
// ModelConfig checks mRoPE.
TextConfig parse_text_config(const nlohmann::json& text, const TextDialect& dialect, const std::string& where);

// The hybrid decoder of a qwen3_5 config (text_config.model_type "qwen3_5_text", or
// "qwen3_next" for Qwen3-Next's layout), with transformers' defaults (Qwen3_5TextConfig,
// Qwen3NextConfig). Reads layer_types (or full_attention_interval), the linear_* keys,
// partial_rotary_factor; checks them (layer kinds, head counts dividing, silu, no
// mixture-of-experts MLP) with errors naming the key and the value. `moe`: a qwen3_5_moe
// config's ("qwen3_5_moe_text", Qwen3_5MoeTextConfig's defaults): every layer's MLP a
// mixture of experts with a shared expert (moe_config.h).
TextConfig parse_hybrid_text_config(const nlohmann::json& text, const std::string& where, bool moe = false);

// The decoder's attention as the planner prices its bytes (plan/attention_cost.h): its
// heads, K/V heads, head size and full-attention layers, at `element_bytes` an element.
plan::AttentionShape attention_shape(const TextConfig& text, int64_t element_bytes);

}  // namespace mmsp::model
