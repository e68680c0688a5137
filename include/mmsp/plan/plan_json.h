// JSON forms: batch.json in (Hugging Face field names) and the plan out
// (docs/plan-command.md documents both), plus the text summary of `mmsp plan`.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mmsp/plan/step_plan.h"

namespace mmsp::plan {

// {"sequences": [{"input_ids": [...], "image_grid_thw": [[t,h,w],...], ...}, ...]}
Batch batch_from_json(const nlohmann::json& batch);

nlohmann::json rank_plan_to_json(const StepPlan& plan, const RankPlan& rank);

// The whole plan with the given ranks' slots.
nlohmann::json step_plan_to_json(const Batch& batch, const StepPlan& plan, const std::vector<int>& ranks);

// Per-rank loads and balance, one line per rank.
std::string step_plan_summary(const StepPlan& plan);

// The same step under both placements side by side: per context rank tokens, padding,
// causal pairs and planned attention bytes, then the totals and ratios.
std::string placement_comparison(const StepPlan& zigzag, const StepPlan& adaptive);

}  // namespace mmsp::plan
