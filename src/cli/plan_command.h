// `mmsp plan`: prints the step plan of a batch (per-rank loads and balance, or JSON).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"

namespace mmsp::cli {
// The model layer's check of a config.json (the mmsp tool passes model::parse_model_config,
// so that `mmsp plan` refuses what `mmsp train` refuses); throws mmsp::Error, returns
// the vocabulary size the batch's token ids are checked against. Unset: the planner's
// conventions only (test_plan links the plan layer alone).
using ConfigValidator = std::function<int64_t(const nlohmann::json& config, const std::string& path)>;
Subcommand add_plan_command(CLI::App& parent, ConfigValidator validate = {});
}  // namespace mmsp::cli
