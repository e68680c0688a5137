// A rollout's numbers on one line of a .jsonl (RL objectives, docs/rl.md#the-rollout-fields):
// the advantages, the old policy's and the reference model's log-probabilities, each
// given per labelled token in order (what `mmsp logprobs` writes for the line) or, for the
// advantages, one number for the whole sequence (GRPO's per-sequence advantage).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mmsp::train {

struct RolloutValues {
  std::vector<double> advantages;    // one per labelled token, or one (the sequence's)
  std::vector<double> old_logprobs;  // empty (on-policy: the current policy's, detached) or one per labelled token
  std::vector<double> ref_logprobs;  // empty (no reference) or one per labelled token
  bool empty() const { return advantages.empty() && old_logprobs.empty() && ref_logprobs.empty(); }
  // The advantage of labelled token `k` (0-based among the sequence's labelled tokens).
  double advantage(int64_t k) const { return advantages.size() == 1 ? advantages[0] : advantages[k]; }
};

// The field names, as the line spells them.
inline const char* const kRolloutFields[] = {"advantages", "old_logprobs", "ref_logprobs"};

// Reads the fields of `object` present (null: absent) for a sample with `labelled` labelled
// tokens, checking each against the rule and naming `where` ("file.jsonl:7"), the field and
// the value: a list of numbers (the advantages may be one number), as many as the labelled
// tokens, finite, and log-probabilities at most 0 (1e-6 of rounding allowed).
RolloutValues read_rollout_values(const nlohmann::json& object, int64_t labelled, const std::string& where);

}  // namespace mmsp::train
