// Model conventions from a Hugging Face config.json, with released defaults per family.
#include "mmsp/plan/model_conventions.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"

namespace mmsp::plan {

bool ModelConventions::uses_mrope() const {
  return family == ModelFamily::qwen2_vl || family == ModelFamily::qwen2_5_vl ||
         family == ModelFamily::qwen3_vl;
}

bool ModelConventions::video_frames_as_blocks() const { return family == ModelFamily::qwen3_vl; }

std::string to_string(ModelFamily family) {
  switch (family) {
    case ModelFamily::qwen2_vl: return "qwen2_vl";
    case ModelFamily::qwen2_5_vl: return "qwen2_5_vl";
    case ModelFamily::qwen3_vl: return "qwen3_vl";
    case ModelFamily::llava: return "llava";
    case ModelFamily::internvl: return "internvl";
  }
  return "unknown";
}

ModelConventions default_conventions(ModelFamily family) {
  ModelConventions c;
  c.family = family;
  switch (family) {
    case ModelFamily::qwen2_vl:  // Qwen2-VL-7B-Instruct config.json
      c.mrope_section = {16, 24, 24};
      c.tokens_per_second = 1.0;  // unused: Qwen2-VL's t index is the frame
      break;
    case ModelFamily::qwen2_5_vl:  // Qwen2.5-VL-7B-Instruct: vision_config.tokens_per_second = 2
      c.mrope_section = {16, 24, 24};
      c.tokens_per_second = 2.0;
      break;
    case ModelFamily::qwen3_vl:  // Qwen3-VL: interleaved mRoPE, text_config.rope_scaling
      c.mrope_section = {24, 20, 20};
      c.mrope_interleaved = true;
      c.tokens_per_second = 1.0;  // unused: timestamps are text
      break;
    case ModelFamily::llava:  // llava-hf/llava-1.5-7b-hf: <image> = 32000, CLS dropped, no merge
      c.image_token_id = 32000;
      c.video_token_id = -1;
      c.vision_start_token_id = -1;
      c.vision_end_token_id = -1;
      c.spatial_merge_size = 1;
      break;
    case ModelFamily::internvl:  // InternVL3-hf: <img> 151665, </img> 151666, <IMG_CONTEXT> 151667
      c.image_token_id = 151667;
      c.video_token_id = -1;
      c.vision_start_token_id = 151665;
      c.vision_end_token_id = 151666;
      c.spatial_merge_size = 2;  // pixel shuffle with downsample_ratio 0.5
      break;
  }
  return c;
}

namespace {

int64_t read_id(const nlohmann::json& j, const char* key, int64_t fallback) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  MMSP_CHECK(j.at(key).is_number_integer(), "config.json: ", key,
             " must be an integer token id, got ", j.at(key).dump());
  const int64_t v = j.at(key).get<int64_t>();
  MMSP_CHECK(v >= 0, "config.json: ", key, " must be >= 0, got ", v);
  return v;
}

const nlohmann::json* find_object(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_object()) return nullptr;
  return &j.at(key);
}

void read_mrope(const nlohmann::json& rope, ModelConventions& c) {
  if (rope.contains("mrope_section")) {
    const auto& s = rope.at("mrope_section");
    MMSP_CHECK(s.is_array() && s.size() == 3, "config.json: rope_scaling.mrope_section must be ",
               "3 integers [t, h, w], got ", s.dump());
    for (int i = 0; i < 3; ++i) {
      MMSP_CHECK(s[i].is_number_integer() && s[i].get<int64_t>() >= 0,
                 "config.json: rope_scaling.mrope_section must be 3 integers >= 0, got ", s.dump());
      c.mrope_section[i] = s[i].get<int64_t>();
    }
  }
  if (rope.contains("mrope_interleaved") && rope.at("mrope_interleaved").is_boolean())
    c.mrope_interleaved = rope.at("mrope_interleaved").get<bool>();
}

// Newer transformers write rope_parameters where older files have rope_scaling.
void rope_parameters_as_scaling(nlohmann::json& j) {
  if (j.is_object() && j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      (!j.contains("rope_scaling") || j["rope_scaling"].is_null()))
    j["rope_scaling"] = j["rope_parameters"];
}

}  // namespace

ModelConventions conventions_from_config(const nlohmann::json& file, const ModelConventions& defaults) {
  MMSP_CHECK(file.is_object(), "config.json must be a JSON object, got ", file.type_name());
  nlohmann::json config = file;
  rope_parameters_as_scaling(config);
  if (config.contains("text_config")) rope_parameters_as_scaling(config["text_config"]);
  ModelConventions c = defaults;
  const nlohmann::json* vision = find_object(config, "vision_config");
  const nlohmann::json* text = find_object(config, "text_config");

  if (c.family == ModelFamily::llava) {
    // transformers renamed image_token_index to image_token_id; accept both.
    c.image_token_id = read_id(config, "image_token_index", c.image_token_id);
    c.image_token_id = read_id(config, "image_token_id", c.image_token_id);
    // "full" keeps the class token: 1 + patches placeholder rows per image.
    if (config.contains("vision_feature_select_strategy")) {
      const auto& strategy = config.at("vision_feature_select_strategy");
      MMSP_CHECK(strategy == "default" || strategy == "full", "config.json: vision_feature_select_strategy ",
                 strategy.dump(), " is not supported; supported: \"default\" (drop the class token), \"full\"");
      c.class_rows = strategy == "full" ? 1 : 0;
    }
    return c;
  }
  c.image_token_id = read_id(config, "image_token_id", c.image_token_id);
  if (c.family == ModelFamily::internvl) {
    c.vision_start_token_id = read_id(config, "image_start_token_id", c.vision_start_token_id);
    c.vision_end_token_id = read_id(config, "image_end_token_id", c.vision_end_token_id);
    if (config.contains("downsample_ratio")) {
      const auto& r = config.at("downsample_ratio");
      MMSP_CHECK(r.is_number() && r.get<double>() > 0 && r.get<double>() <= 1,
                 "config.json: downsample_ratio must be in (0, 1], got ", r.dump());
      const double inv = 1.0 / r.get<double>();
      MMSP_CHECK(std::fabs(inv - std::round(inv)) < 1e-6 && inv <= 64, "config.json: downsample_ratio ",
                 r.get<double>(), " must be 1/k for an integer k in 1..64 (pixel shuffle)");
      c.spatial_merge_size = static_cast<int64_t>(std::round(inv));
    }
    return c;
  }
  // Qwen family.
  c.video_token_id = read_id(config, "video_token_id", c.video_token_id);
  c.vision_start_token_id = read_id(config, "vision_start_token_id", c.vision_start_token_id);
  c.vision_end_token_id = read_id(config, "vision_end_token_id", c.vision_end_token_id);
  if (vision) {
    if (vision->contains("spatial_merge_size")) {
      const auto& m = vision->at("spatial_merge_size");
      MMSP_CHECK(m.is_number_integer() && m.get<int64_t>() >= 1,
                 "config.json: vision_config.spatial_merge_size must be an integer >= 1, got ",
                 m.dump());
      c.spatial_merge_size = m.get<int64_t>();
    }
    if (c.family == ModelFamily::qwen2_5_vl && vision->contains("tokens_per_second")) {
      const auto& t = vision->at("tokens_per_second");
      MMSP_CHECK(t.is_number() && t.get<double>() >= 0 && t.get<double>() <= kMaxTokensPerSecond,
                 "config.json: vision_config.tokens_per_second must be a number in [0, ", kMaxTokensPerSecond,
                 "], got ", t.dump(), " (it scales video positions)");
      c.tokens_per_second = t.get<double>();
    }
  }
  // rope_scaling sits at the top (Qwen2/2.5-VL) or in text_config (Qwen3-VL, newer files).
  if (const nlohmann::json* rope = find_object(config, "rope_scaling")) read_mrope(*rope, c);
  if (text) {
    if (const nlohmann::json* rope = find_object(*text, "rope_scaling")) read_mrope(*rope, c);
  }
  const std::array<int64_t, 4> ids{c.image_token_id, c.video_token_id, c.vision_start_token_id,
                                   c.vision_end_token_id};
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j)
      MMSP_CHECK(ids[i] != ids[j], "config.json: image, video, vision start and vision end ",
                 "token ids must differ, got ", ids[0], ", ", ids[1], ", ", ids[2], ", ", ids[3]);
  return c;
}

}  // namespace mmsp::plan
