// Decoder config: transformers' defaults per family (Qwen2VLTextConfig, Qwen2_5_VLTextConfig,
// Qwen3VLTextConfig, LlamaConfig) and the checks a decoder needs before any weight exists.
#include "mmsp/model/text_config.h"

#include "config_parts.h"

#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/model/activation.h"

namespace mmsp::model {

using json_fields::JsonFields;

const char* to_string(LayerKind kind) {
  return kind == LayerKind::linear_attention ? "linear_attention" : "full_attention";
}

int64_t TextConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

LayerKind TextConfig::layer_kind(int64_t layer) const {
  MMSP_ASSERT(layer >= 0 && layer < num_hidden_layers);
  return layer_types.empty() ? LayerKind::full_attention : layer_types.at(layer);
}

TextConfig default_text_config(ModelFamily family) {
  TextConfig t;  // Qwen2VLTextConfig
  switch (family) {
    case ModelFamily::qwen2_vl:
      break;
    case ModelFamily::qwen2_5_vl:  // Qwen2_5_VLTextConfig: the same numbers
      t.model_type = "qwen2_5_vl_text";
      break;
    case ModelFamily::qwen3_vl:  // Qwen3VLTextConfig
      t.model_type = "qwen3_vl_text";
      t.vocab_size = 151936;
      t.hidden_size = 4096;
      t.intermediate_size = 22016;
      t.num_hidden_layers = 32;
      t.num_attention_heads = 32;
      t.num_key_value_heads = 32;
      t.head_dim = 128;
      t.rms_norm_eps = 1e-6;
      t.rope_theta = 5000000.0;
      t.max_position_embeddings = 128000;
      t.qkv_bias = false;
      t.qk_norm = true;
      break;
    case ModelFamily::llava:  // LlamaConfig, LLaVA's default text_config
      t.model_type = "llama";
      t.vocab_size = 32000;
      t.hidden_size = 4096;
      t.intermediate_size = 11008;
      t.num_hidden_layers = 32;
      t.num_attention_heads = 32;
      t.num_key_value_heads = 32;
      t.head_dim = 128;
      t.rms_norm_eps = 1e-6;
      t.rope_theta = 10000.0;
      t.max_position_embeddings = 2048;
      t.qkv_bias = false;
      break;
    case ModelFamily::internvl:  // Qwen2Config, InternVLConfig's default text_config
      t.model_type = "qwen2";
      t.vocab_size = 151936;
      t.hidden_size = 4096;
      t.intermediate_size = 22016;
      t.num_hidden_layers = 32;
      t.num_attention_heads = 32;
      t.num_key_value_heads = 32;
      t.head_dim = 128;
      t.rms_norm_eps = 1e-6;
      t.rope_theta = 10000.0;
      t.max_position_embeddings = 32768;
      break;
  }
  return t;
}

namespace {

// InternVL3.5's decoder: Qwen3Config (no q/k/v bias, RMSNorm on each query and key head,
// head_dim 128 whatever the width).
TextConfig qwen3_text_config() {
  TextConfig t = default_text_config(ModelFamily::internvl);
  t.model_type = "qwen3";
  t.qkv_bias = false;
  t.qk_norm = true;
  return t;
}

}  // namespace

namespace {

// rope_scaling (or rope_parameters) may only say what mmsp implements: plain RoPE for
// Llama, mRoPE for the Qwen family. Scaled variants (linear, dynamic, yarn, llama3) are not.
void check_rope_type(const JsonFields& f, ModelFamily family) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const nlohmann::json* rope = f.object(key);
    if (!rope) continue;
    const JsonFields r(*rope, f.name(key) + ".");
    for (const char* type_key : {"type", "rope_type"}) {
      const std::string type = r.string(type_key, "default");
      // InternVL3's Qwen2 decoders say "dynamic" (NTK scaling): transformers changes the
      // frequencies only for sequences beyond max_position_embeddings, which InternVLModel refuses.
      const bool ok = family == ModelFamily::internvl
                          ? type == "default" || type == "dynamic"
                          : type == "default" || (family != ModelFamily::llava && type == "mrope");
      MMSP_CHECK(ok, r.name(type_key), " \"", type, "\" is not supported; ",
                 family == ModelFamily::llava      ? "Llama decoders use plain RoPE (\"default\")"
                 : family == ModelFamily::internvl ? "InternVL decoders use \"default\" or \"dynamic\""
                                                   : "Qwen-VL decoders use \"mrope\" or \"default\"");
    }
    if (family == ModelFamily::internvl)
      MMSP_CHECK(!r.has("mrope_section"), r.name("mrope_section"), " is set, but InternVL's decoder uses ",
                 "1-D RoPE; remove it");
    r.boolean("mrope_interleaved", false);  // type check; the planner reads the value
    if (family == ModelFamily::llava) {
      for (const char* k : {"factor", "mrope_section"})
        MMSP_CHECK(!r.has(k), r.name(k), " is set, but scaled or multimodal RoPE is not ",
                   "supported for llava; remove it");
    }
  }
}

}  // namespace

TextConfig parse_text_config(const nlohmann::json& text, ModelFamily family,
                             const std::string& where) {
  TextConfig t = default_text_config(family);
  const JsonFields f(text, where);
  const bool nested = !where.empty();
  if (family == ModelFamily::internvl && f.string("model_type", "qwen2") == "qwen3") t = qwen3_text_config();
  if (nested && f.has("model_type")) {
    const std::string type = f.string("model_type", t.model_type);
    MMSP_CHECK(type == t.model_type, f.name("model_type"), " \"", type, "\" is not supported for ",
               to_string(family), "; expected \"", t.model_type, "\"",
               family == ModelFamily::internvl ? " or \"qwen3\"" : "");
  }
  t.vocab_size = f.integer("vocab_size", t.vocab_size);
  t.hidden_size = f.integer("hidden_size", t.hidden_size);
  t.intermediate_size = f.integer("intermediate_size", t.intermediate_size);
  t.num_hidden_layers = f.integer("num_hidden_layers", t.num_hidden_layers);
  t.num_attention_heads = f.integer("num_attention_heads", t.num_attention_heads);
  config_parts::check_size_limits(f, {{"vocab_size", t.vocab_size, config_parts::kMaxVocab},
                                      {"hidden_size", t.hidden_size, config_parts::kMaxWidth},
                                      {"intermediate_size", t.intermediate_size, config_parts::kMaxWidth},
                                      {"num_hidden_layers", t.num_hidden_layers, config_parts::kMaxLayers},
                                      {"num_attention_heads", t.num_attention_heads, config_parts::kMaxWidth}});
  // Llama's default is "as many as the query heads"; every family reads null that way.
  const bool kv_is_heads = family == ModelFamily::llava ||
                           (text.is_object() && text.contains("num_key_value_heads") &&
                            text.at("num_key_value_heads").is_null());
  t.num_key_value_heads = f.integer("num_key_value_heads",
                                    kv_is_heads ? t.num_attention_heads : t.num_key_value_heads);
  // Qwen3-VL's head_dim defaults to 128 on its own; the others derive it from the width.
  const bool head_dim_set = f.has("head_dim") || family == ModelFamily::qwen3_vl || t.model_type == "qwen3";
  if (!head_dim_set) {
    MMSP_CHECK(t.hidden_size % t.num_attention_heads == 0, f.name("num_attention_heads"), " (",
               t.num_attention_heads, ") must divide ", f.name("hidden_size"), " (",
               t.hidden_size, "); head_dim is not set, so it is hidden_size / num_attention_heads");
    t.head_dim = t.hidden_size / t.num_attention_heads;
  }
  t.head_dim = f.integer("head_dim", t.head_dim);
  MMSP_CHECK(t.head_dim % 2 == 0, f.name("head_dim"), " (", t.head_dim,
             ") must be even: RoPE rotates pairs of channels");
  MMSP_CHECK(t.num_attention_heads % t.num_key_value_heads == 0, f.name("num_key_value_heads"),
             " (", t.num_key_value_heads, ") must divide ", f.name("num_attention_heads"), " (",
             t.num_attention_heads, ")");

  t.hidden_act = f.string("hidden_act", t.hidden_act);
  MMSP_CHECK(is_supported_activation(t.hidden_act), f.name("hidden_act"), " \"", t.hidden_act,
             "\" is not supported; supported: silu, gelu, gelu_pytorch_tanh, quick_gelu, relu");
  t.rms_norm_eps = f.number("rms_norm_eps", t.rms_norm_eps);
  t.rope_theta = f.number("rope_theta", t.rope_theta);
  if (const nlohmann::json* params = f.object("rope_parameters")) {
    const JsonFields p(*params, f.name("rope_parameters."));
    t.rope_theta = p.number("rope_theta", t.rope_theta);
  }
  check_rope_type(f, family);
  t.max_position_embeddings = f.integer("max_position_embeddings", t.max_position_embeddings);
  t.initializer_range = f.number("initializer_range", t.initializer_range, true);

  if (family == ModelFamily::qwen2_vl || family == ModelFamily::qwen2_5_vl || t.model_type == "qwen2") {
    // Qwen2's attention hard-wires biases on q/k/v and none on o.
    MMSP_CHECK(!f.boolean("use_sliding_window", false), f.name("use_sliding_window"),
               " is true; sliding-window attention is not supported");
  } else {
    t.qkv_bias = t.o_bias = f.boolean("attention_bias", t.qkv_bias);
  }
  if (family == ModelFamily::llava) t.mlp_bias = f.boolean("mlp_bias", t.mlp_bias);
  return t;
}

}  // namespace mmsp::model
