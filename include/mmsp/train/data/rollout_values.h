// A rollout's numbers on one line of a .jsonl (RL objectives, docs/rl.md#the-rollout-fields):
// the advantages, the old policy's and the reference model's log-probabilities, each
// given per labelled token in order (what `mmsp logprobs` writes for the line) or, for the
// advantages, one number for the whole sequence (GRPO's per-sequence advantage).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mmsp::train {

// A side of a preference pair (a DPO line: {"chosen": {...}, "rejected": {...}}): the
// dataset holds pair p's chosen side at sample 2p and its rejected side at 2p + 1.
struct PreferenceSide {
  int64_t pair = -1;  // -1: the sample is not a side of a pair
  bool chosen = false;
  std::optional<double> ref_logps;  // the reference model's Σ log p over the side's labelled tokens
};

struct RolloutValues {
  std::vector<double> advantages;    // one per labelled token, or one (the sequence's)
  std::vector<double> old_logprobs;  // empty (on-policy: the current policy's, detached) or one per labelled token
  std::vector<double> ref_logprobs;  // empty (no reference) or one per labelled token
  PreferenceSide preference;
  bool empty() const {
    return advantages.empty() && old_logprobs.empty() && ref_logprobs.empty() && preference.pair < 0;
  }
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

// A pair line's own fields besides its two sides: "ref_chosen_logps" and
// "ref_rejected_logps" (TRL's names), each a finite number ≤ 0 (1e-6 allowed) or absent.
// Written into the sides' `preference` (pair `pair`); a side that also gives ref_logprobs
// per token is refused (one source of the reference each), else their sum is its ref_logps.
void read_pair_references(const nlohmann::json& line, int64_t pair, RolloutValues& chosen, RolloutValues& rejected,
                          const std::string& where);

// An `mmsp logprobs` output file (one JSON line per sample: "index", "logprobs") as the
// log-probability lists of a dataset of `samples` samples, by index: every index in
// 0 .. samples − 1 exactly once, each list of finite numbers ≤ 0 (1e-6 allowed). Errors name
// `flag`, the file and line.
std::vector<std::vector<double>> read_logprobs_file(const std::string& path, int64_t samples, const std::string& flag);

// The keys of a pair line.
inline const char* const kPairFields[] = {"chosen", "rejected", "ref_chosen_logps", "ref_rejected_logps"};

}  // namespace mmsp::train
