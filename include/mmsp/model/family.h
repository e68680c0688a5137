// Model families as plug-ins. A Family reads its part of a config.json (vision tower,
// projector, the planner's conventions), builds its Vlm, gives its processor geometry
// and its checkpoint names. The registry (family_registry.cpp) is the one table from
// Hugging Face model_type to family; config parsing, the trainer, the data readers,
// the benchmarks and `mmsp plan` look families up there and never branch on them.
// Adding a family: its folder under model/families/ and one line in the registry.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mmsp/hf/hf_directory.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/vision/pixel_geometry.h"
#include "mmsp/model/vision/vision_memory.h"
#include "mmsp/plan/model_conventions.h"

namespace mmsp::model {

class Vlm;

// How the family's processor writes its vision tokens as text (empty: no such token).
struct VisionTokenWords {
  std::string image, video, start, end;
};

class Family {
 public:
  virtual ~Family() = default;

  // Its folder under model/families/ ("qwen_vl", "llava", "internvl"): its name in
  // the family table (family_table(), python/mmsp/families.json) and the tests' labels.
  virtual const char* name() const = 0;

  // The model_type values it serves ("qwen2_vl", "llava", ...).
  virtual std::vector<std::string> model_types() const = 0;

  // The planner's conventions (token ids, merge, positions) of a config.json of one of
  // model_types(); parsing only, no decoder or vision fields. Errors name the field.
  virtual plan::ModelConventions conventions(const nlohmann::json& config) const = 0;

  // Fills `c` (model_type set) from the whole config.json: text, conventions, vision
  // tower and whatever ties them together. Errors name the field and value.
  virtual void read_config(const nlohmann::json& config, ModelConfig& c) const = 0;

  // The model, parameters drawn as model::ParameterInitScope says.
  virtual std::shared_ptr<Vlm> build(const ModelConfig& c) const = 0;

  // How its processor turns pixels into the tower's input and placeholder rows.
  virtual std::shared_ptr<const PixelGeometry> geometry(const ModelConfig& c) const = 0;

  // Which checkpoint names feed which parameters (legacy and current layouts).
  virtual hf::CheckpointNaming checkpoint_naming(const ModelConfig& c) const = 0;

  // Its vision tokens as text ("<|image_pad|>", "<image>", ...).
  virtual VisionTokenWords token_words() const = 0;

  // What its tower keeps per token it encodes (vision_memory.h), for the preflight.
  virtual VisionMemoryShape vision_memory(const ModelConfig& c) const = 0;
};

// The family serving `model_type`; an unknown one is an error listing the supported.
const Family& family_for(const std::string& model_type);

// "qwen2_vl, qwen2_5_vl, ...": every model_type of every registered family.
std::string supported_model_types();

// The registry as data, for the Python side (`mmsp families --json` writes it to
// python/mmsp/families.json, which `mmsp prepare` and the tests read; a test holds the
// committed file equal to it): one entry per model_type, in the registry's order.
struct FamilyEntry {
  std::string model_type;
  std::string family;  // Family::name()
  VisionTokenWords words;
};
std::vector<FamilyEntry> family_table();

// Shorthands: the family of c.model_type asked for its model / geometry.
std::shared_ptr<Vlm> build_vlm(const ModelConfig& c);
std::shared_ptr<const PixelGeometry> pixel_geometry(const ModelConfig& c);

// The planner's conventions of a config.json, by its model_type (mmsp plan, tests).
plan::ModelConventions conventions_from_config(const nlohmann::json& config);

}  // namespace mmsp::model
