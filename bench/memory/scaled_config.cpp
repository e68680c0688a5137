// See scaled_config.h.
#include "scaled_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "mmsp/core/check.h"

namespace mmsp::bench {
namespace {

using nlohmann::json;

// The first `keep` entries of `config[key]` where it is an array.
void cut_list(json& config, const char* key, int64_t keep) {
  if (!config.contains(key) || !config[key].is_array()) return;
  json kept = json::array();
  for (int64_t i = 0; i < std::min<int64_t>(keep, config[key].size()); ++i) kept.push_back(config[key][i]);
  config[key] = kept;
}

// Block indexes below `depth` only.
void drop_indexes(json& config, const char* key, int64_t depth) {
  if (!config.contains(key) || !config[key].is_array()) return;
  json kept = json::array();
  for (const json& i : config[key])
    if (i.get<int64_t>() < depth) kept.push_back(i);
  config[key] = kept;
}

bool is_token_id_key(const std::string& key) {
  auto ends = [&](const std::string& tail) {
    return key.size() > tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends("_token_id") || ends("_token_index");
}

void cut_decoder(json& text, int64_t layers, const std::string& model) {
  MMSP_CHECK(text.contains("num_hidden_layers"), model, ": no num_hidden_layers to cut to ", layers);
  text["num_hidden_layers"] = std::min<int64_t>(layers, text["num_hidden_layers"].get<int64_t>());
  cut_list(text, "layer_types", text["num_hidden_layers"].get<int64_t>());
}

void cut_vision(json& vision, int64_t blocks, const std::string& model) {
  const char* key = vision.contains("depth") ? "depth" : "num_hidden_layers";  // Qwen : CLIP, InternViT
  MMSP_CHECK(vision.contains(key), model, ": vision_config has no depth or num_hidden_layers to cut to ", blocks);
  const int64_t depth = std::min<int64_t>(blocks, vision[key].get<int64_t>());
  vision[key] = depth;
  drop_indexes(vision, "fullatt_block_indexes", depth);
  drop_indexes(vision, "deepstack_visual_indexes", depth);
}

// vocab_size = `vocab` wherever it is set; every special id at or above it moves to the
// top of the new vocabulary, distinct ids to distinct ids, in their old order.
void cut_vocab(json& config, int64_t vocab, const std::string& model) {
  std::vector<json*> levels = {&config};
  if (config.contains("text_config")) levels.push_back(&config["text_config"]);
  std::map<int64_t, int64_t> moved;  // old id -> new id
  for (json* level : levels)
    for (auto& [key, value] : level->items())
      if (is_token_id_key(key) && value.is_number_integer() && value.get<int64_t>() >= vocab)
        moved[value.get<int64_t>()] = 0;
  MMSP_CHECK(static_cast<int64_t>(moved.size()) < vocab, model, ": --vocab ", vocab, " cannot hold its ", moved.size(),
             " special token ids");
  int64_t next = vocab - static_cast<int64_t>(moved.size());
  for (auto& [old_id, new_id] : moved) new_id = next++;
  bool found = false;
  for (json* level : levels)
    for (auto& [key, value] : level->items()) {
      if (key == "vocab_size") {
        MMSP_CHECK(value.get<int64_t>() >= vocab, model, ": --vocab ", vocab, " is above its vocab_size ",
                   value.dump());
        value = vocab;
        found = true;
      } else if (is_token_id_key(key) && value.is_number_integer() && moved.count(value.get<int64_t>())) {
        value = moved.at(value.get<int64_t>());
      }
    }
  MMSP_CHECK(found, model, ": no vocab_size to cut to ", vocab);
}

}  // namespace

std::string scaled_config(const std::string& model, const ConfigScale& scale, const std::string& tag) {
  if (!scale.any()) return model;
  MMSP_CHECK(std::filesystem::exists(model), "--layers, --vision-layers and --vocab scale a config file; ", model,
             " is not one");
  std::ifstream in(model);
  json config = json::parse(in);
  json& text = config.contains("text_config") ? config["text_config"] : config;
  if (scale.layers > 0) cut_decoder(text, scale.layers, model);
  if (scale.vision_layers > 0) {
    MMSP_CHECK(config.contains("vision_config"), model, ": no vision_config to cut to ", scale.vision_layers,
               " blocks");
    cut_vision(config["vision_config"], scale.vision_layers, model);
  }
  if (scale.vocab > 0) cut_vocab(config, scale.vocab, model);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("mmsp-bench-memory-" + tag + "-" + std::filesystem::path(model).filename().string()))
                               .string();
  std::ofstream(path) << config.dump(2);
  return path;
}

}  // namespace mmsp::bench
