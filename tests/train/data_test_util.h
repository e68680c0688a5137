// Helpers shared by the data tests: the shipped tiny configs and error-message capture.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "error_of.h"
#include "mmsp/core/check.h"
#include "mmsp/model/config/config.h"

namespace mmsp::train::testing {

// configs/<name>.json of the source tree.
inline model::ModelConfig tiny_config(const std::string& name) {
  return model::load_model_config(std::string(MMSP_SOURCE_DIR) + "/configs/" + name + ".json");
}

inline std::string source_path(const std::string& relative) { return std::string(MMSP_SOURCE_DIR) + "/" + relative; }

using ::mmsp::test::error_of;  // tests/support/error_of.h

}  // namespace mmsp::train::testing
