// Reading and checking a line's rollout fields; see mmsp/train/data/rollout_values.h.
#include "mmsp/train/data/rollout_values.h"

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"

namespace mmsp::train {
namespace {

using nlohmann::json;

// A rollout engine's log-probabilities can round a hair above 0; more is not one.
constexpr double kLogprobSlack = 1e-6;

double number(const json& v, const std::string& name, const std::string& where) {
  MMSP_CHECK(v.is_number(), where, ": ", name, " is ", v.dump(), ", expected a number");
  const double x = v.get<double>();
  MMSP_CHECK(std::isfinite(x), where, ": ", name, " is ", x, ", expected a finite number");
  return x;
}

std::vector<double> per_token(const json& object, const char* field, int64_t labelled, const std::string& where,
                              bool per_sequence_ok, bool logprob) {
  std::vector<double> out;
  const auto it = object.find(field);
  if (it == object.end() || it->is_null()) return out;
  if (per_sequence_ok && it->is_number()) {
    out.push_back(number(*it, field, where));
    return out;
  }
  MMSP_CHECK(it->is_array(), where, ": ", field, " must be a list of numbers (one per labelled token",
             per_sequence_ok ? ", or one number for the sequence" : "", "), got ", it->dump().substr(0, 80));
  MMSP_CHECK(static_cast<int64_t>(it->size()) == labelled, where, ": ", field, " has ", it->size(),
             " values; the sample has ", labelled,
             " labelled tokens (one value per labelled token, in order, as mmsp logprobs writes them",
             per_sequence_ok ? "; or one number for the sequence" : "", ")");
  out.reserve(it->size());
  for (size_t k = 0; k < it->size(); ++k) {
    const std::string name = detail::concat(field, "[", k, "]");
    out.push_back(number((*it)[k], name, where));
    MMSP_CHECK(!logprob || out.back() <= kLogprobSlack, where, ": ", name, " is ", out.back(),
               ": a log-probability is at most 0");
  }
  return out;
}

}  // namespace

std::vector<std::vector<double>> read_logprobs_file(const std::string& path, int64_t samples, const std::string& flag) {
  std::ifstream in(path);
  MMSP_CHECK(in.good(), flag, " ", path, ": cannot open (the --out of mmsp logprobs over the same --data)");
  std::vector<std::vector<double>> out(static_cast<size_t>(samples));
  std::vector<bool> seen(static_cast<size_t>(samples), false);
  std::string text;
  for (int64_t line_number = 1; std::getline(in, text); ++line_number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = detail::concat(flag, " ", path, ":", line_number);
    const json line = parse_json_text(text, where);
    MMSP_CHECK(line.is_object() && line.contains("index") && line["index"].is_number_integer(), where,
               ": expected mmsp logprobs' line {\"index\": N, \"logprobs\": [...]}");
    const int64_t index = line["index"].get<int64_t>();
    MMSP_CHECK(index >= 0 && index < samples, where, ": index ", index, " is not a sample of --data (0 .. ",
               samples - 1, "): the file is of another --data");
    MMSP_CHECK(!seen[static_cast<size_t>(index)], where, ": index ", index, " again");
    seen[static_cast<size_t>(index)] = true;
    const auto it = line.find("logprobs");
    MMSP_CHECK(it != line.end() && it->is_array(), where, ": logprobs must be a list of numbers");
    for (size_t k = 0; k < it->size(); ++k) {
      const std::string name = detail::concat("logprobs[", k, "]");
      const double x = number((*it)[k], name, where);
      MMSP_CHECK(x <= kLogprobSlack, where, ": ", name, " is ", x, ": a log-probability is at most 0");
      out[static_cast<size_t>(index)].push_back(x);
    }
  }
  for (int64_t i = 0; i < samples; ++i)
    MMSP_CHECK(seen[static_cast<size_t>(i)], flag, " ", path, " has no line for sample ", i, " of --data's ", samples,
               ": the file is of another --data (or cut short)");
  return out;
}

void read_pair_references(const json& line, int64_t pair, RolloutValues& chosen, RolloutValues& rejected,
                          const std::string& where) {
  for (const bool is_chosen : {true, false}) {
    RolloutValues& side = is_chosen ? chosen : rejected;
    const char* field = is_chosen ? "ref_chosen_logps" : "ref_rejected_logps";
    side.preference.pair = pair;
    side.preference.chosen = is_chosen;
    const auto it = line.find(field);
    if (it != line.end() && !it->is_null()) {
      MMSP_CHECK(side.ref_logprobs.empty(), where, ": ", field, " and ", is_chosen ? "chosen" : "rejected",
                 ".ref_logprobs both give the reference; give one");
      const double x = number(*it, field, where);
      MMSP_CHECK(x <= kLogprobSlack, where, ": ", field, " is ", x, ": a sum of log-probabilities is at most 0");
      side.preference.ref_logps = x;
    } else if (!side.ref_logprobs.empty()) {
      double sum = 0;
      for (const double v : side.ref_logprobs) sum += v;
      side.preference.ref_logps = sum;
    }
  }
}

RolloutValues read_rollout_values(const json& object, int64_t labelled, const std::string& where) {
  RolloutValues v;
  v.advantages = per_token(object, "advantages", labelled, where, true, false);
  v.old_logprobs = per_token(object, "old_logprobs", labelled, where, false, true);
  v.ref_logprobs = per_token(object, "ref_logprobs", labelled, where, false, true);
  return v;
}

}  // namespace mmsp::train
