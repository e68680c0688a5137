// config.json -> ModelConfig: finds the family of model_type in the registry and lets it
// read its text, vision and planner fields; the pieces every family shares
// (config_parts.h: conventions, tied embeddings, token ids against the vocabulary).
#include "mmsp/model/config/config.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "config_parts.h"
#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#include "mmsp/model/family.h"
#include "mmsp/model/layers/activation.h"

namespace mmsp::model {

namespace config_parts {

plan::ModelConventions read_conventions(const Family& family, const nlohmann::json& config) {
  try {
    return family.conventions(config);
  } catch (const Error& e) {
    std::string message = e.what();
    const std::string prefix = "config.json: ";
    if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
    throw Error(message);
  }
}

bool read_tie(const json_fields::JsonFields& top, const json_fields::JsonFields& text) {
  return top.boolean("tie_word_embeddings", false) || text.boolean("tie_word_embeddings", false);
}

void check_size_limits(const json_fields::JsonFields& f, std::initializer_list<SizeLimit> limits) {
  for (const SizeLimit& l : limits)
    MMSP_CHECK(l.value <= l.max, f.name(l.key), " ", l.value, " is beyond what mmsp builds: at most ", l.max,
               " (released models stay far below; the bound keeps a typo from exhausting the host)");
}

void check_activation(const json_fields::JsonFields& f, const std::string& key, const std::string& value) {
  MMSP_CHECK(is_supported_activation(value), f.name(key), " \"", value,
             "\" is not supported; supported: silu, gelu, gelu_pytorch_tanh, quick_gelu, relu");
}

void check_token_ids(const ModelConfig& c, const char* image_token_field) {
  const std::pair<const char*, int64_t> ids[] = {{image_token_field, c.conventions.image_token_id},
                                                 {"video_token_id", c.conventions.video_token_id},
                                                 {"vision_start_token_id", c.conventions.vision_start_token_id},
                                                 {"vision_end_token_id", c.conventions.vision_end_token_id}};
  for (const auto& [name, id] : ids)
    MMSP_CHECK(id < c.text.vocab_size, name, " (", id, ") must be < the decoder's vocab_size (", c.text.vocab_size,
               ")");
}

}  // namespace config_parts

namespace {

ModelConfig parse(const nlohmann::json& config) {
  MMSP_CHECK(config.is_object(), "the top level must be a JSON object, got ", config.type_name());
  const json_fields::JsonFields top(config, "");
  MMSP_CHECK(top.has("model_type"), "model_type is missing; supported: ", supported_model_types());
  ModelConfig c;
  c.model_type = top.string("model_type", "");
  family_for(c.model_type).read_config(config, c);
  return c;
}

}  // namespace

ModelConfig parse_model_config(const nlohmann::json& config, const std::string& source) {
  try {
    return parse(config);
  } catch (const Error& e) { throw Error(source + ": " + e.what()); }
}

ModelConfig load_model_config(const std::string& path) {
  MMSP_CHECK(std::ifstream(path).good(), path, ": cannot open model config");
  return parse_model_config(read_json_file(path), path);
}

plan::AttentionShape planned_attention_shape(const nlohmann::json& config, const std::string& source,
                                             std::string& why) {
  try {
    return attention_shape(parse_model_config(config, source).text, 2);
  } catch (const Error& error) {
    why = std::string("attention bytes priced at Qwen2-VL-7B's shape: ") + error.what();
    return plan::AttentionShape{};
  }
}

}  // namespace mmsp::model
