// The readers the families' conventions parsers share; see model_conventions.h.
#include "mmsp/plan/model_conventions.h"

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"

namespace mmsp::plan::conventions_fields {

void check_object(const nlohmann::json& config) {
  MMSP_CHECK(config.is_object(), "config.json must be a JSON object, got ", config.type_name());
}

int64_t token_id(const nlohmann::json& j, const char* key, int64_t fallback) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  MMSP_CHECK(j.at(key).is_number_integer(), "config.json: ", key, " must be an integer token id, got ",
             j.at(key).dump());
  const int64_t v = j.at(key).get<int64_t>();
  MMSP_CHECK(v >= 0, "config.json: ", key, " must be >= 0, got ", v);
  return v;
}

const nlohmann::json* object(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_object()) return nullptr;
  return &j.at(key);
}

namespace {

void read_rope(const nlohmann::json& rope, ModelConventions& c) {
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

// rope_scaling, or rope_parameters where newer transformers write it instead.
const nlohmann::json* rope_of(const nlohmann::json& j) {
  const nlohmann::json* scaling =
      j.contains("rope_scaling") && !j.at("rope_scaling").is_null() ? &j.at("rope_scaling") : nullptr;
  if (!scaling) return object(j, "rope_parameters");
  return scaling->is_object() ? scaling : nullptr;
}

}  // namespace

void read_mrope(const nlohmann::json& config, ModelConventions& c) {
  if (const nlohmann::json* rope = rope_of(config)) read_rope(*rope, c);
  if (const nlohmann::json* text = object(config, "text_config"))
    if (const nlohmann::json* rope = rope_of(*text)) read_rope(*rope, c);
}

void check_distinct_token_ids(const ModelConventions& c) {
  const std::array<int64_t, 4> ids{c.image_token_id, c.video_token_id, c.vision_start_token_id, c.vision_end_token_id};
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j)
      MMSP_CHECK(ids[i] != ids[j], "config.json: image, video, vision start and vision end ",
                 "token ids must differ, got ", ids[0], ", ", ids[1], ", ", ids[2], ", ", ids[3]);
}

}  // namespace mmsp::plan::conventions_fields
