// The one table from Hugging Face model_type to model family; see family.h. A new
// family adds its line here and its folder under families/.
#include "mmsp/model/family.h"

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/model/families/internvl/internvl_family.h"
#include "mmsp/model/families/llava/llava_family.h"
#include "mmsp/model/families/qwen_vl/qwen_vl_family.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {

namespace {

const std::vector<const Family*>& registered() {
  static const std::vector<const Family*> families = {
      &qwen_vl_family(),
      &llava_family(),
      &internvl_family(),
  };
  return families;
}

}  // namespace

std::string supported_model_types() {
  std::string out;
  for (const Family* f : registered())
    for (const std::string& type : f->model_types()) out += (out.empty() ? "" : ", ") + type;
  return out;
}

std::vector<FamilyEntry> family_table() {
  std::vector<FamilyEntry> out;
  for (const Family* f : registered())
    for (const std::string& type : f->model_types()) out.push_back({type, f->name(), f->token_words()});
  return out;
}

const Family& family_for(const std::string& model_type) {
  for (const Family* f : registered())
    for (const std::string& type : f->model_types())
      if (type == model_type) return *f;
  MMSP_CHECK(model_type != "qwen3_next", "model_type \"qwen3_next\" is a text-only checkpoint; the ",
             "model layer builds vision-language models: use model_type \"qwen3_5\" with a text_config ",
             "of model_type \"qwen3_next\" and a vision_config");
  MMSP_FAIL("model_type \"", model_type,
            "\" is not supported by the model layer; supported: ", supported_model_types());
  throw Error("unreachable");
}

std::shared_ptr<Vlm> build_vlm(const ModelConfig& c) { return family_for(c.model_type).build(c); }

std::shared_ptr<const PixelGeometry> pixel_geometry(const ModelConfig& c) {
  return family_for(c.model_type).geometry(c);
}

plan::ModelConventions conventions_from_config(const nlohmann::json& config) {
  MMSP_CHECK(config.is_object(), "config.json must be a JSON object, got ", config.type_name());
  MMSP_CHECK(config.contains("model_type"), "config.json has no \"model_type\" string; expected one of ",
             supported_model_types());
  MMSP_CHECK(config.at("model_type").is_string(), "config.json: model_type must be a string (", supported_model_types(),
             "), got ", config.at("model_type").dump());
  try {
    return family_for(config.at("model_type").get<std::string>()).conventions(config);
  } catch (const Error& e) {
    const std::string message = e.what();
    if (message.rfind("config.json", 0) == 0) throw;
    throw Error("config.json: " + message);
  }
}

}  // namespace mmsp::model
