// Which parameters are a mixture-of-experts layer's experts, by their checkpoint names
// (mlp.experts.gate_up_proj / down_proj, or mlp.experts.<e>.*), and which expert a
// per-expert name holds: what expert parallelism sums, shards and gathers apart.
#pragma once

#include <cstdint>
#include <string>

namespace mmsp::model {

bool is_expert_parameter(const std::string& name);

// The expert index of a per-expert name ("...mlp.experts.<e>.gate_proj.weight"); -1 for
// any other name (a fused expert tensor included).
int64_t expert_index(const std::string& name);

// The same name for expert `e` (a per-expert name; else `name` unchanged).
std::string with_expert_index(const std::string& name, int64_t e);

}  // namespace mmsp::model
