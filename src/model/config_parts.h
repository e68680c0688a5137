// Private to src/model: the pieces of config.json reading every family shares (the
// planner's conventions with the file's own error prefix, tied embeddings).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "json_fields.h"
#include "mmsp/model/config.h"
#include "mmsp/model/family.h"
#include "mmsp/plan/model_conventions.h"

namespace mmsp::model::config_parts {

// family.conventions(config) without its "config.json: " prefix (parse_model_config
// adds the file's own).
plan::ModelConventions read_conventions(const Family& family, const nlohmann::json& config);

// tie_word_embeddings at the top level or in text_config: either true ties.
bool read_tie(const json_fields::JsonFields& top, const json_fields::JsonFields& text);

// Every placeholder and marker token id of c.conventions below c.text.vocab_size;
// `image_token_field` names the image token as the family's files do.
void check_token_ids(const ModelConfig& c, const char* image_token_field);

// Throws unless activation() implements `value`, naming the field f.name(key).
void check_activation(const json_fields::JsonFields& f, const std::string& key, const std::string& value);

}  // namespace mmsp::model::config_parts
