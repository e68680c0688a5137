// The language decoder's config (Qwen2-VL / Qwen2.5-VL / Qwen3-VL text, LLaVA's Llama),
// typed and validated. Defaults are what Hugging Face transformers uses when a key is
// missing, so a config.json means the same model here as there. mRoPE sections live in
// plan::ModelConventions (the planner needs them too); ModelConfig checks them against head_dim.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/plan/model_conventions.h"

namespace mmsp::model {

struct TextConfig {
  // HF model_type of the decoder: "qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "llama"
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
};

// Hugging Face's defaults for the decoder of `family` (the values above are Qwen2-VL's).
TextConfig default_text_config(plan::ModelFamily family);

// Reads the decoder fields of `text` (the top-level object for Qwen2/2.5-VL files without
// text_config, else text_config). `where` prefixes field names in errors ("text_config.").
// Checks the fields and the rules between them (heads divide hidden_size when head_dim is
// derived, kv heads divide heads, head_dim even for RoPE); ModelConfig checks mRoPE.
TextConfig parse_text_config(const nlohmann::json& text, plan::ModelFamily family,
                             const std::string& where);


}  // namespace mmsp::model
