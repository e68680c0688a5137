// The hybrid decoder's config (Qwen3.5 text, Qwen3-Next): transformers' defaults
// (Qwen3_5TextConfig, Qwen3NextConfig), which layers are Gated DeltaNet layers, the
// linear-attention sizes, partial RoPE; refuses what mmsp does not build (other RoPE
// types, a GDN activation other than silu, Qwen3-Next's mixture-of-experts MLP).
#include <algorithm>

#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/model/config/text_config.h"

namespace mmsp::model {

using json_fields::JsonFields;

namespace {

// Qwen3_5TextConfig, Qwen3NextConfig for "qwen3_next", Qwen3_5MoeTextConfig for "qwen3_5_moe_text".
TextConfig default_hybrid_text_config(const std::string& model_type) {
  TextConfig t;
  t.model_type = model_type;
  const bool next = model_type == "qwen3_next", moe = model_type == "qwen3_5_moe_text";
  t.vocab_size = next ? 151936 : 248320;
  t.hidden_size = next || moe ? 2048 : 4096;
  t.intermediate_size = next ? 5632 : 12288;  // Qwen3.5-MoE has no dense MLP
  t.num_hidden_layers = next ? 48 : moe ? 40 : 32;
  t.num_attention_heads = 16;
  t.num_key_value_heads = next || moe ? 2 : 4;
  t.head_dim = 256;
  t.rms_norm_eps = 1e-6;
  t.rope_theta = 10000.0;  // transformers' default when the file gives none
  t.max_position_embeddings = 32768;
  t.qkv_bias = t.o_bias = false;
  t.qk_norm = true;
  t.linear_split_projections = !next;
  t.partial_rotary_factor = 0.25;
  t.attn_output_gate = true;
  t.zero_centered_norm = true;
  return t;
}

// "linear_attention" / "full_attention", and the legacy names transformers remaps.
LayerKind layer_kind_of(const JsonFields& f, const nlohmann::json& list, size_t i) {
  const nlohmann::json& e = list[i];
  const std::string name = e.is_string() ? e.get<std::string>() : e.dump();
  if (e.is_string() && (name == "linear_attention" || name == "mamba")) return LayerKind::linear_attention;
  if (e.is_string() && (name == "full_attention" || name == "attention")) return LayerKind::full_attention;
  MMSP_FAIL(f.name("layer_types"), "[", i, "] is ", e.is_string() ? "\"" + name + "\"" : name,
            "; supported layer kinds: \"linear_attention\" (Gated DeltaNet), \"full_attention\"");
}

std::vector<LayerKind> read_layer_types(const JsonFields& f, int64_t layers) {
  std::vector<LayerKind> kinds;
  if (f.has("layer_types")) {
    const nlohmann::json& list = f.at("layer_types");
    MMSP_CHECK(list.is_array(), f.name("layer_types"), " must be a list of layer kinds, got ", list.dump());
    MMSP_CHECK(static_cast<int64_t>(list.size()) == layers, f.name("layer_types"), " has ", list.size(),
               " entries but ", f.name("num_hidden_layers"), " is ", layers, "; give one kind per layer");
    for (size_t i = 0; i < list.size(); ++i) kinds.push_back(layer_kind_of(f, list, i));
    f.integer("full_attention_interval", 4);  // type check; transformers ignores it when layer_types is set
    return kinds;
  }
  // transformers: layer i is full attention iff (i + 1) % interval == 0.
  const int64_t interval = f.integer("full_attention_interval", 4);
  for (int64_t i = 0; i < layers; ++i)
    kinds.push_back((i + 1) % interval ? LayerKind::linear_attention : LayerKind::full_attention);
  return kinds;
}

// RoPE: plain or mRoPE frequencies only; partial_rotary_factor from rope_parameters, then
// the top level (older files), else 0.25.
void read_rope(const JsonFields& f, TextConfig& t) {
  t.rope_theta = f.number("rope_theta", t.rope_theta);
  double factor = f.number("partial_rotary_factor", t.partial_rotary_factor);
  std::string factor_key = f.name("partial_rotary_factor");
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const nlohmann::json* rope = f.object(key);
    if (!rope) continue;
    const JsonFields r(*rope, f.name(key) + ".");
    for (const char* type_key : {"type", "rope_type"}) {
      const std::string type = r.string(type_key, "default");
      MMSP_CHECK(type == "default" || type == "mrope", r.name(type_key), " \"", type, "\" is not supported; ",
                 t.model_type, " decoders use \"default\" (scaled RoPE variants are not built)");
    }
    r.boolean("mrope_interleaved", true);  // type check; ModelConfig checks the value
    t.rope_theta = r.number("rope_theta", t.rope_theta);
    if (r.has("partial_rotary_factor")) {
      factor = r.number("partial_rotary_factor", factor);
      factor_key = r.name("partial_rotary_factor");
    }
  }
  MMSP_CHECK(factor <= 1.0, factor_key, " must be in (0, 1], got ", factor);
  t.partial_rotary_factor = factor;
  const int64_t dim = t.rotary_dim();
  MMSP_CHECK(dim >= 2 && dim % 2 == 0, factor_key, " (", factor, ") times ", f.name("head_dim"), " (", t.head_dim,
             ") gives ", dim, " rotary channels; RoPE needs an even number >= 2");
}

void read_linear_attention(const JsonFields& f, TextConfig& t) {
  t.linear_num_key_heads = f.integer("linear_num_key_heads", t.linear_num_key_heads);
  t.linear_num_value_heads = f.integer("linear_num_value_heads", t.linear_num_value_heads);
  t.linear_key_head_dim = f.integer("linear_key_head_dim", t.linear_key_head_dim);
  t.linear_value_head_dim = f.integer("linear_value_head_dim", t.linear_value_head_dim);
  t.linear_conv_kernel_dim = f.integer("linear_conv_kernel_dim", t.linear_conv_kernel_dim);
  MMSP_CHECK(t.linear_num_value_heads % t.linear_num_key_heads == 0, f.name("linear_num_value_heads"), " (",
             t.linear_num_value_heads, ") must be a multiple of ", f.name("linear_num_key_heads"), " (",
             t.linear_num_key_heads, "): each key head serves the same number of value heads");
}

// Qwen3-Next's MLP is a mixture of experts on layer i unless num_experts is 0, i is in
// mlp_only_layers, or (i + 1) % decoder_sparse_step != 0. mmsp builds the dense MLP only.
void refuse_experts(const JsonFields& f, const TextConfig& t) {
  const int64_t experts = f.integer("num_experts", 512, 0);
  if (experts == 0) return;
  const int64_t step = f.integer("decoder_sparse_step", 1);
  const std::vector<int64_t> dense = f.integers("mlp_only_layers", {});
  for (int64_t i = 0; i < t.num_hidden_layers; ++i) {
    const bool sparse = (i + 1) % step == 0 && std::find(dense.begin(), dense.end(), i) == dense.end();
    MMSP_CHECK(!sparse, f.name("num_experts"), " is ", experts, f.has("num_experts") ? "" : " (not set; default)",
               ", so layer ", i, "'s MLP is a mixture of experts, which is not supported; set ", f.name("num_experts"),
               " to 0 or list every layer in ", f.name("mlp_only_layers"));
  }
}

}  // namespace

TextConfig parse_hybrid_text_config(const nlohmann::json& text, const std::string& where, bool moe) {
  const JsonFields f(text, where);
  std::string type = f.string("model_type", moe ? "qwen3_5_moe_text" : "qwen3_5_text");
  if (type == "qwen3_5" || type == "qwen3_5_moe") type += "_text";  // older files name it like the model
  if (moe)
    MMSP_CHECK(type == "qwen3_5_moe_text", f.name("model_type"), " \"", type,
               "\" is not supported for qwen3_5_moe; expected \"qwen3_5_moe_text\"");
  else
    MMSP_CHECK(type == "qwen3_5_text" || type == "qwen3_next", f.name("model_type"), " \"", type,
               "\" is not supported for qwen3_5; expected \"qwen3_5_text\" or \"qwen3_next\"",
               type.find("moe") != std::string::npos ? " (a mixture-of-experts decoder: model_type qwen3_5_moe)" : "");
  TextConfig t = default_hybrid_text_config(type);
  t.vocab_size = f.integer("vocab_size", t.vocab_size);
  t.hidden_size = f.integer("hidden_size", t.hidden_size);
  t.intermediate_size = f.integer("intermediate_size", t.intermediate_size);
  t.num_hidden_layers = f.integer("num_hidden_layers", t.num_hidden_layers);
  t.num_attention_heads = f.integer("num_attention_heads", t.num_attention_heads);
  const bool kv_null =
      text.is_object() && text.contains("num_key_value_heads") && text.at("num_key_value_heads").is_null();
  t.num_key_value_heads = f.integer("num_key_value_heads", kv_null ? t.num_attention_heads : t.num_key_value_heads);
  MMSP_CHECK(t.num_attention_heads % t.num_key_value_heads == 0, f.name("num_key_value_heads"), " (",
             t.num_key_value_heads, ") must divide ", f.name("num_attention_heads"), " (", t.num_attention_heads, ")");
  t.head_dim = f.integer("head_dim", t.head_dim);
  // The GDN's conv uses hidden_act too (transformers: self.activation = config.hidden_act).
  t.hidden_act = f.string("hidden_act", t.hidden_act);
  MMSP_CHECK(t.hidden_act == "silu", f.name("hidden_act"), " \"", t.hidden_act, "\" is not supported for ", type,
             ": the MLP and the Gated DeltaNet conv are built with silu");
  t.rms_norm_eps = f.number("rms_norm_eps", t.rms_norm_eps);
  t.max_position_embeddings = f.integer("max_position_embeddings", t.max_position_embeddings);
  t.initializer_range = f.number("initializer_range", t.initializer_range, true);
  t.qkv_bias = t.o_bias = f.boolean("attention_bias", false);
  // transformers' attention always has the output gate, whatever the file says.
  MMSP_CHECK(f.boolean("attn_output_gate", true), f.name("attn_output_gate"), " is false, but ", type,
             "'s attention always gates its output (q_proj yields query and gate)");
  read_rope(f, t);
  t.layer_types = read_layer_types(f, t.num_hidden_layers);
  read_linear_attention(f, t);
  if (type == "qwen3_next") refuse_experts(f, t);
  // Qwen3_5MoeTextConfig: 256 experts, 8 a token, width 512, a shared expert of 512.
  if (moe)
    t.moe = parse_moe_config(text, where, {256, 8, 512, 512, ExpertLayout::per_expert, false}, t.num_hidden_layers);
  return t;
}

}  // namespace mmsp::model
