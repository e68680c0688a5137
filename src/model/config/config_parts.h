// Private to src/model: the pieces of config.json reading every family shares (the
// planner's conventions with the file's own error prefix, tied embeddings).
#pragma once

#include <cstdint>
#include <initializer_list>

#include <nlohmann/json_fwd.hpp>

#include "json_fields.h"
#include "mmsp/model/config/config.h"
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

// Upper bounds of a config's sizes, far beyond any released model (the largest have
// ~130 layers, widths below 64k, vocabularies below 300k): a typo such as
// num_hidden_layers 1e9 is refused while reading config.json, before a skeleton of
// that many modules exhausts the host, and every tensor's bytes stay within int64.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden, intermediate, embedding and head sizes
constexpr int64_t kMaxVocab = int64_t{1} << 24;
struct SizeLimit {
  const char* key;
  int64_t value;
  int64_t max;
};
// Throws for the first value above its bound: "config.json: vision_config.depth 100000
// is beyond what mmsp builds: at most 1024 (...)".
void check_size_limits(const json_fields::JsonFields& f, std::initializer_list<SizeLimit> limits);

}  // namespace mmsp::model::config_parts
