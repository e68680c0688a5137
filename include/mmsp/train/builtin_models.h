// Models that `mmsp train --model NAME` knows by name: Hugging Face config.json files
// shipped in configs/ and compiled into the tool, so the demo needs no files.
#pragma once

#include <string>
#include <vector>

#include "mmsp/model/config.h"

namespace mmsp::train {

struct ResolvedModel {
  std::string source;       // the built-in name or the path
  std::string config_json;  // the file's text (saved next to every checkpoint)
  model::ModelConfig config;
};

// Names of the built-in models.
std::vector<std::string> builtin_model_names();

// A built-in name, or else a path to a config.json; errors name both choices.
ResolvedModel resolve_model(const std::string& name_or_path);

}  // namespace mmsp::train
