// config.json -> ModelConfig: finds the text and vision objects where each family keeps
// them, reads them, and checks what ties them together (mRoPE sections vs head_dim, the
// merger's width vs the decoder's, deepstack levels vs decoder layers, token ids vs vocab).
// qwen3_5 is a hybrid decoder behind Qwen3-VL's vision tower (without deepstack): it takes
// the qwen3_vl family's conventions (positions, placeholders) with its own token ids.
#include "mmsp/model/config.h"

#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "json_fields.h"
#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"

namespace mmsp::model {

using json_fields::join;
using json_fields::JsonFields;
using plan::ModelFamily;

namespace {

constexpr const char* kSupported = "qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, llava, internvl";

ModelFamily family_of(const std::string& model_type) {
  if (model_type == "qwen2_vl") return ModelFamily::qwen2_vl;
  if (model_type == "qwen2_5_vl") return ModelFamily::qwen2_5_vl;
  if (model_type == "qwen3_vl" || model_type == "qwen3_5") return ModelFamily::qwen3_vl;
  if (model_type == "llava") return ModelFamily::llava;
  if (model_type == "internvl") return ModelFamily::internvl;
  MMSP_CHECK(model_type != "qwen3_next", "model_type \"qwen3_next\" is a text-only checkpoint; the ",
             "model layer builds vision-language models: use model_type \"qwen3_5\" with a text_config ",
             "of model_type \"qwen3_next\" and a vision_config");
  MMSP_CHECK(false, "model_type \"", model_type, "\" is not supported by the model layer; ",
             "supported: ", kSupported);
  return ModelFamily::qwen2_vl;
}

plan::ModelConventions read_conventions(const nlohmann::json& config, bool nested_text) {
  try {
    return plan::conventions_from_config(config);  // knows rope_parameters and qwen3_5
  } catch (const Error& e) {
    std::string message = e.what();
    const std::string prefix = "config.json: ";
    if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
    throw Error(message);
  }
}

// Where mrope_section came from, for error messages; empty when the family default applied.
std::string rope_field(const JsonFields& text) {
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (text.has(key) && text.at(key).is_object() && text.at(key).contains("mrope_section"))
      return text.name(key) + ".mrope_section";
  return "";
}

void check_mrope(const ModelConfig& c, const JsonFields& text) {
  const auto& s = c.conventions.mrope_section;
  int64_t sum = 0;
  const bool overflow =
      __builtin_add_overflow(s[0], s[1], &sum) || __builtin_add_overflow(sum, s[2], &sum);
  const std::string field = rope_field(text);
  const bool partial = c.text.rotary_dim() != c.text.head_dim;
  MMSP_CHECK(!overflow && sum == c.text.rotary_dim() / 2,
             field.empty() ? text.name("rope_scaling.mrope_section") + " (not set; default " +
                                 join({s[0], s[1], s[2]}) + ")"
                           : field + " " + join({s[0], s[1], s[2]}),
             " sums to ", overflow ? std::string("more than 2^63") : std::to_string(sum),
             partial ? " but must be the rotary channels / 2 = int(head_dim · partial_rotary_factor) / 2 = " +
                           std::to_string(c.text.rotary_dim()) + " / 2"
                     : " but must be head_dim / 2 = " + std::to_string(c.text.head_dim) + " / 2",
             " (t, h and w share the head's rotary frequencies)");
  const bool interleave = c.family == ModelFamily::qwen3_vl;
  MMSP_CHECK(c.conventions.mrope_interleaved == interleave, text.name("rope_scaling"),
             ".mrope_interleaved is ", c.conventions.mrope_interleaved ? "true" : "false",
             ", but ", c.model_type, " always ", interleave ? "interleaves" : "splits",
             " the t/h/w frequencies", interleave ? "" : " into contiguous sections");
}

void check_token_ids(const ModelConfig& c) {
  const std::pair<const char*, int64_t> ids[] = {
      {c.family == ModelFamily::llava ? "image_token_index" : "image_token_id",
       c.conventions.image_token_id},
      {"video_token_id", c.conventions.video_token_id},
      {"vision_start_token_id", c.conventions.vision_start_token_id},
      {"vision_end_token_id", c.conventions.vision_end_token_id}};
  for (const auto& [name, id] : ids)
    MMSP_CHECK(id < c.text.vocab_size, name, " (", id, ") must be < the decoder's vocab_size (",
               c.text.vocab_size, ")");
}

// Qwen3.5's vision tower is Qwen3-VL's without deepstack mergers, its rotary base fixed
// at 10000; the copy returned says so to the Qwen-VL vision parser.
nlohmann::json qwen3_5_vision(const nlohmann::json* vision) {
  nlohmann::json v = vision ? *vision : nlohmann::json::object();
  const JsonFields f(v, "vision_config.");
  const std::string type = f.string("model_type", "qwen3_5_vision");
  MMSP_CHECK(type == "qwen3_5_vision" || type == "qwen3_5", f.name("model_type"), " \"", type,
             "\" is not supported for qwen3_5; expected \"qwen3_5_vision\"");
  const std::vector<int64_t> deepstack = f.integers("deepstack_visual_indexes", {});
  MMSP_CHECK(deepstack.empty(), f.name("deepstack_visual_indexes"), " ", join(deepstack),
             " must be empty: Qwen3.5's vision tower has no deepstack mergers");
  if (const nlohmann::json* rope = f.object("rope_parameters")) {
    const JsonFields r(*rope, f.name("rope_parameters."));
    const std::string rope_type = r.string("rope_type", "axial");
    MMSP_CHECK(rope_type == "axial" || rope_type == "default", r.name("rope_type"), " \"", rope_type,
               "\" is not supported; the vision tower's 2-D rotary is \"axial\"");
    const double theta = r.number("rope_theta", 10000.0);
    MMSP_CHECK(theta == 10000.0, r.name("rope_theta"), " (", theta,
               ") is not supported; the vision rotary base is 10000");
  }
  v["deepstack_visual_indexes"] = nlohmann::json::array();
  return v;
}

bool read_tie(const JsonFields& top, const JsonFields& text) {
  return top.boolean("tie_word_embeddings", false) || text.boolean("tie_word_embeddings", false);
}

ModelConfig parse(const nlohmann::json& config) {
  MMSP_CHECK(config.is_object(), "the top level must be a JSON object, got ", config.type_name());
  const JsonFields top(config, "");
  MMSP_CHECK(top.has("model_type"), "model_type is missing; supported: ", kSupported);
  ModelConfig c;
  c.model_type = top.string("model_type", "");
  c.family = family_of(c.model_type);

  // Qwen2/2.5-VL files keep decoder fields at the top (newer transformers nest them in
  // text_config, which then wins, as in transformers); Qwen3-VL and LLaVA always nest them.
  const nlohmann::json* nested = top.object("text_config");
  const bool qwen2 = c.family == ModelFamily::qwen2_vl || c.family == ModelFamily::qwen2_5_vl;
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json& text_json = nested ? *nested : qwen2 ? config : kEmpty;
  const JsonFields text(text_json, nested || !qwen2 ? "text_config." : "");
  const bool hybrid = c.model_type == "qwen3_5";
  c.text = hybrid ? parse_hybrid_text_config(text_json, "text_config.")
                  : parse_text_config(text_json, c.family, nested || !qwen2 ? "text_config." : "");
  c.conventions = read_conventions(config, nested != nullptr);
  c.tie_word_embeddings = read_tie(top, text);

  const nlohmann::json* vision = top.object("vision_config");
  if (c.family == ModelFamily::llava) {
    c.clip_vision = vision ? parse_clip_vision_config(*vision) : default_llava_vision_config();
    c.llava = parse_llava_projector_config(config, *c.clip_vision);
  } else if (c.family == ModelFamily::internvl) {
    c.intern_vision = parse_intern_vision_config(vision ? *vision : kEmpty);
    c.internvl = parse_internvl_projector_config(config, *c.intern_vision);
    // The planner read the same downsample_ratio: one merge factor for placeholders and rows.
    MMSP_ASSERT(c.internvl->scale() == c.conventions.spatial_merge_size);
  } else {
    c.qwen_vision = hybrid ? parse_qwen_vision_config(qwen3_5_vision(vision), c.family)
                           : parse_qwen_vision_config(vision ? *vision : kEmpty, c.family);
    const QwenVisionConfig& v = *c.qwen_vision;
    MMSP_ASSERT(v.spatial_merge_size == c.conventions.spatial_merge_size);
    check_mrope(c, text);
    const char* out_key =
        c.family == ModelFamily::qwen2_vl ? "vision_config.hidden_size" : "vision_config.out_hidden_size";
    MMSP_CHECK(v.out_hidden_size == c.text.hidden_size, out_key, " (", v.out_hidden_size,
               ") must equal the decoder's ", text.name("hidden_size"), " (", c.text.hidden_size,
               "): merged vision rows replace token embeddings");
    MMSP_CHECK(static_cast<int64_t>(v.deepstack_visual_indexes.size()) <= c.text.num_hidden_layers,
               "vision_config.deepstack_visual_indexes ", join(v.deepstack_visual_indexes),
               " feeds ", v.deepstack_visual_indexes.size(), " decoder layers, but ",
               text.name("num_hidden_layers"), " is ", c.text.num_hidden_layers);
  }
  check_token_ids(c);
  return c;
}

}  // namespace

ModelConfig parse_model_config(const nlohmann::json& config, const std::string& source) {
  try {
    return parse(config);
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
}

ModelConfig load_model_config(const std::string& path) {
  MMSP_CHECK(std::ifstream(path).good(), path, ": cannot open model config");
  return parse_model_config(read_json_file(path), path);
}

}  // namespace mmsp::model
