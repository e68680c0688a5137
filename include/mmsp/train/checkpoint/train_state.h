// The trainer's resumable position as stored in a checkpoint's state.json, and the
// CPU RNG state it carries:
//   {"version": 1, "step": 42, "data": {"epoch": 0, "offset": 1234},
//    "cpu_rng": "<hex of the default CPU at::Generator's get_state()>",
//    "run": {free-form: config, flags, mesh, ...}}
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace mmsp::train {

// Checks `state` (every field above, integers ≥ 0, hex RNG, "run" an object, no
// other key) and returns it with "version" set. Errors name `source` and the field.
nlohmann::json check_train_state(const nlohmann::json& state, const std::string& source);

// The default CPU generator's state as hex, and back (errors name `source`).
std::string capture_cpu_rng();
void restore_cpu_rng(const std::string& hex, const std::string& source);

}  // namespace mmsp::train
