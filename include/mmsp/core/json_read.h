// The one way mmsp reads JSON (batch files, configs, JSON-lines data, state.json, the
// HF index, checksums.json): nesting limited (deep input cannot exhaust the stack),
// a key twice in one object refused naming the key and the file, UTF-8 checked
// (nlohmann's lexer refuses ill-formed UTF-8 in strings), every failure an
// mmsp::Error naming `where`; integers read with a range. Header-only: nlohmann is
// already a dependency of every layer that reads JSON.
#pragma once

#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"

namespace mmsp {

// Deeper than any input of mmsp needs (a config nests 3 levels, a batch 4).
constexpr int kMaxJsonDepth = 64;

namespace detail {
// The key as an error quotes it: at most 80 characters.
inline std::string brief_key(const std::string& key) { return key.size() <= 80 ? key : key.substr(0, 77) + "..."; }
}  // namespace detail

// Parses `text`; `where` names it in errors ("batch.json", "data.jsonl:12").
inline nlohmann::json parse_json_text(const std::string& text, const std::string& where,
                                      int max_depth = kMaxJsonDepth) {
  // Depth first, by a scan of the brackets outside strings: the parser never sees
  // input nested deeper than the limit.
  {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (in_string) {
        if (escaped)
          escaped = false;
        else if (c == '\\')
          escaped = true;
        else if (c == '"')
          in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        MMSP_CHECK(++depth <= max_depth, where, ": JSON nests deeper than ", max_depth, " levels (at byte ", i,
                   "); no mmsp input needs that many");
      } else if (c == ']' || c == '}') {
        --depth;
      }
    }
  }
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        MMSP_CHECK(!open_objects.empty() && open_objects.back().insert(key).second, where, ": the key \"",
                   detail::brief_key(key), "\" appears twice in one object (which one is meant?)");
        break;
      }
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, callback);
  } catch (const nlohmann::json::exception& e) { throw Error(detail::concat(where, ": not valid JSON: ", e.what())); }
}

// Reads and parses the file at `path` (errors name it).
inline nlohmann::json read_json_file(const std::string& path, int max_depth = kMaxJsonDepth) {
  std::ifstream in(path, std::ios::binary);
  MMSP_CHECK(in.good(), path, ": cannot read");
  std::ostringstream text;
  text << in.rdbuf();
  MMSP_CHECK(!in.bad(), path, ": read failed");
  return parse_json_text(text.str(), path, max_depth);
}

// `value` as an integer in [min, max]; `what` names it ("batch.json: sequences[2].input_ids[5]").
inline int64_t json_to_int(const nlohmann::json& value, const std::string& what, int64_t min, int64_t max) {
  const bool is_int = value.is_number_integer() &&
                      !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
  MMSP_CHECK(is_int, what, " must be an integer, got ", value.is_string() ? "a string" : value.type_name(),
             value.is_number() ? " " + value.dump() : std::string());
  const int64_t v = value.get<int64_t>();
  MMSP_CHECK(v >= min && v <= max, what, " = ", v, " is outside [", min, ", ", max, "]");
  return v;
}

// object[key] as an integer in [min, max]; the key is required.
inline int64_t json_int(const nlohmann::json& object, const std::string& key, const std::string& where, int64_t min,
                        int64_t max) {
  MMSP_CHECK(object.is_object() && object.contains(key), where, ": \"", key, "\" is missing");
  return json_to_int(object.at(key), where + ": " + key, min, max);
}

}  // namespace mmsp
