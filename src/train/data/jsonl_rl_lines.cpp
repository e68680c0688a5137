// A .jsonl's lines for the RL objectives: preference pairs (two samples each) and the
// log-probabilities `mmsp logprobs` wrote for the file, joined to its samples
// (data/rollout_values.h, docs/data-jsonl.md#rl-fields). JsonlDataset's, beside the file's
// reading in jsonl_dataset.cpp.
#include <algorithm>
#include <iterator>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/plan/labels.h"
#include "mmsp/train/data/jsonl_dataset.h"

namespace mmsp::train {

void JsonlDataset::read_pair(const nlohmann::json& object, const std::string& where, int64_t number) {
  // A preference pair: its sides are samples 2p and 2p + 1 (data/rollout_values.h).
  for (const auto& item : object.items())
    MMSP_CHECK(std::find(std::begin(kPairFields), std::end(kPairFields), item.key()) != std::end(kPairFields), where,
               ": unknown field \"", item.key(),
               "\" in a preference pair (fields: chosen, rejected, ref_chosen_logps, ref_rejected_logps)");
  for (const char* side : {"chosen", "rejected"})
    MMSP_CHECK(object.contains(side) && object.at(side).is_object(), where, ": a preference pair needs ", side,
               " as a sample object ({\"input_ids\": ..., \"loss_mask\": ...}), got ",
               object.contains(side) ? object.at(side).dump().substr(0, 80) : std::string("none"));
  MMSP_CHECK(samples_.size() % 2 == 0 && std::all_of(samples_.begin(), samples_.end(),
                                                     [](const Sample& s) { return s.rollout.preference.pair >= 0; }),
             where, ": a preference pair after lines that are not pairs: a file is all pairs or none");
  Sample chosen = read_sample(object.at("chosen"), where + " chosen", number);
  Sample rejected = read_sample(object.at("rejected"), where + " rejected", number);
  chosen.side = "chosen";
  rejected.side = "rejected";
  read_pair_references(object, static_cast<int64_t>(samples_.size() / 2), chosen.rollout, rejected.rollout, where);
  samples_.push_back(std::move(chosen));
  samples_.push_back(std::move(rejected));
}

void JsonlDataset::attach_logprobs(const std::string& path, bool reference, const std::string& flag) {
  std::vector<std::vector<double>> lists = read_logprobs_file(path, size(), flag);
  for (int64_t i = 0; i < size(); ++i) {
    Sample& s = samples_[static_cast<size_t>(i)];
    const int64_t labelled = plan::count_labels(s.sequence, config_.conventions);
    std::vector<double>& list = lists[static_cast<size_t>(i)];
    MMSP_CHECK(static_cast<int64_t>(list.size()) == labelled, flag, " ", path, ": sample ", i, " (", location(i),
               ") has ", list.size(), " log-probabilities; the sample has ", labelled,
               " labelled tokens: the file is of another --data");
    std::vector<double>& field = reference ? s.rollout.ref_logprobs : s.rollout.old_logprobs;
    MMSP_CHECK(field.empty() && (!reference || !s.rollout.preference.ref_logps), location(i), ": ",
               reference ? "the reference" : "old_logprobs", " is on the line and in ", flag, " ", path, ": give one");
    if (reference && s.rollout.preference.pair >= 0) {
      double sum = 0;
      for (const double x : list) sum += x;
      s.rollout.preference.ref_logps = sum;
    } else {
      field = std::move(list);
    }
  }
}

}  // namespace mmsp::train
