// Decoder config: read in the family's dialect (its defaults, variants and rules, declared in
// model/families/<name>/) with the checks a decoder needs before any weight exists.
#include "mmsp/model/config/text_config.h"

#include <algorithm>

#include "config_parts.h"

#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/model/layers/activation.h"

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

namespace {

// rope_scaling (or rope_parameters) may only say what mmsp implements for the family
// (mRoPE for Qwen, plain RoPE for Llama, ...). Scaled variants (linear, yarn, llama3) are not.
void check_rope_type(const JsonFields& f, const TextDialect& d) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const nlohmann::json* rope = f.object(key);
    if (!rope) continue;
    const JsonFields r(*rope, f.name(key) + ".");
    for (const char* type_key : {"type", "rope_type"}) {
      const std::string type = r.string(type_key, "default");
      const bool ok = std::find(d.rope_types.begin(), d.rope_types.end(), type) != d.rope_types.end();
      MMSP_CHECK(ok, r.name(type_key), " \"", type, "\" is not supported; ", d.rope_rule);
    }
    for (const std::string& k : d.refused_rope_keys)
      MMSP_CHECK(!r.has(k), r.name(k), " is set, but ", d.refused_rope_reason, "; remove it");
    r.boolean("mrope_interleaved", false);  // type check; the planner reads the value
  }
}

// The variant text_config.model_type names (the first when it names none).
const TextVariant& variant_of(const JsonFields& f, const TextDialect& d, bool nested) {
  MMSP_ASSERT(!d.variants.empty());
  if (!nested || !f.has("model_type")) return d.variants.front();
  const std::string type = f.string("model_type", d.variants.front().defaults.model_type);
  std::string expected;
  for (const TextVariant& v : d.variants) {
    if (v.defaults.model_type == type) return v;
    expected += (expected.empty() ? "\"" : " or \"") + v.defaults.model_type + "\"";
  }
  MMSP_FAIL(f.name("model_type"), " \"", type, "\" is not supported for ", d.family, "; expected ", expected);
  return d.variants.front();  // not reached
}

}  // namespace

TextConfig parse_text_config(const nlohmann::json& text, const TextDialect& dialect, const std::string& where) {
  const JsonFields f(text, where);
  const TextVariant& variant = variant_of(f, dialect, !where.empty());
  TextConfig t = variant.defaults;
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
  const bool kv_is_heads =
      dialect.kv_heads_default_to_heads ||
      (text.is_object() && text.contains("num_key_value_heads") && text.at("num_key_value_heads").is_null());
  t.num_key_value_heads = f.integer("num_key_value_heads", kv_is_heads ? t.num_attention_heads : t.num_key_value_heads);
  const bool head_dim_set = f.has("head_dim") || variant.head_dim_fixed;
  if (!head_dim_set) {
    MMSP_CHECK(t.hidden_size % t.num_attention_heads == 0, f.name("num_attention_heads"), " (", t.num_attention_heads,
               ") must divide ", f.name("hidden_size"), " (", t.hidden_size,
               "); head_dim is not set, so it is hidden_size / num_attention_heads");
    t.head_dim = t.hidden_size / t.num_attention_heads;
  }
  t.head_dim = f.integer("head_dim", t.head_dim);
  MMSP_CHECK(t.head_dim % 2 == 0, f.name("head_dim"), " (", t.head_dim,
             ") must be even: RoPE rotates pairs of channels");
  MMSP_CHECK(t.num_attention_heads % t.num_key_value_heads == 0, f.name("num_key_value_heads"), " (",
             t.num_key_value_heads, ") must divide ", f.name("num_attention_heads"), " (", t.num_attention_heads, ")");

  t.hidden_act = f.string("hidden_act", t.hidden_act);
  MMSP_CHECK(is_supported_activation(t.hidden_act), f.name("hidden_act"), " \"", t.hidden_act,
             "\" is not supported; supported: silu, gelu, gelu_pytorch_tanh, quick_gelu, relu");
  t.rms_norm_eps = f.number("rms_norm_eps", t.rms_norm_eps);
  t.rope_theta = f.number("rope_theta", t.rope_theta);
  if (const nlohmann::json* params = f.object("rope_parameters")) {
    const JsonFields p(*params, f.name("rope_parameters."));
    t.rope_theta = p.number("rope_theta", t.rope_theta);
  }
  check_rope_type(f, dialect);
  t.max_position_embeddings = f.integer("max_position_embeddings", t.max_position_embeddings);
  t.initializer_range = f.number("initializer_range", t.initializer_range, true);

  if (variant.qwen2_attention) {  // biases hard-wired on q/k/v, none on o
    MMSP_CHECK(!f.boolean("use_sliding_window", false), f.name("use_sliding_window"),
               " is true; sliding-window attention is not supported");
  } else {
    t.qkv_bias = t.o_bias = f.boolean("attention_bias", t.qkv_bias);
  }
  if (dialect.reads_mlp_bias) t.mlp_bias = f.boolean("mlp_bias", t.mlp_bias);
  return t;
}

plan::AttentionShape attention_shape(const TextConfig& t, int64_t element_bytes) {
  plan::AttentionShape a;
  a.heads = t.num_attention_heads;
  a.kv_heads = t.num_key_value_heads;
  a.head_dim = t.head_dim;
  a.element_bytes = element_bytes;
  a.layers = t.is_hybrid() ? std::count(t.layer_types.begin(), t.layer_types.end(), LayerKind::full_attention)
                           : t.num_hidden_layers;
  return a;
}

}  // namespace mmsp::model
