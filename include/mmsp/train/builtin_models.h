// What `mmsp train --model X` names: a built-in model (Hugging Face config.json files
// shipped in configs/ and compiled into the tool, so the demo needs no files), a
// config.json (random weights), or a Hugging Face model directory (its weights).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mmsp/hf/hf_directory.h"
#include "mmsp/model/config/config.h"

namespace mmsp::train {

struct ResolvedModel {
  std::string source;       // the built-in name or the path
  std::string config_json;  // the file's text (saved next to every checkpoint)
  model::ModelConfig config;
  // Set for a model directory: its checked shards (headers only; no tensor read yet).
  std::optional<hf::HfDirectory> weights;
};

// Names of the built-in models.
std::vector<std::string> builtin_model_names();

// A built-in name, a Hugging Face model directory, or else a path to a config.json;
// errors name the choices.
ResolvedModel resolve_model(const std::string& name_or_path);

}  // namespace mmsp::train
