// Private to src/model: typed reads of one config.json object. A missing or null key keeps
// the default; a present key of the wrong type or range is an error naming
// "<prefix><key>", the rule and the value.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"

namespace mmsp::model::json_fields {

class JsonFields {
 public:
  // `prefix` is the object's path with a trailing dot ("vision_config.") or "" for the top.
  JsonFields(const nlohmann::json& object, std::string prefix) : object_(object), prefix_(std::move(prefix)) {}

  const nlohmann::json& json() const { return object_; }
  std::string name(const std::string& key) const { return prefix_ + key; }

  // Present and not null.
  bool has(const std::string& key) const {
    return object_.is_object() && object_.contains(key) && !object_.at(key).is_null();
  }
  const nlohmann::json& at(const std::string& key) const { return object_.at(key); }

  // Sizes, counts and ids stay below 2^31 so that products of two of them cannot overflow.
  static constexpr int64_t kMaxInteger = 2147483647;

  int64_t integer(const std::string& key, int64_t fallback, int64_t min = 1) const {
    if (!has(key)) return fallback;
    return checked_integer(at(key), key, min, at(key), false);
  }

  // A number > 0 (or >= 0 when `allow_zero`).
  double number(const std::string& key, double fallback, bool allow_zero = false) const {
    if (!has(key)) return fallback;
    const nlohmann::json& v = at(key);
    const bool ok =
        v.is_number() && std::isfinite(v.get<double>()) && (allow_zero ? v.get<double>() >= 0 : v.get<double>() > 0);
    MMSP_CHECK(ok, name(key), " must be a number ", allow_zero ? ">= 0" : "> 0", ", got ", v.dump());
    return v.get<double>();
  }

  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    MMSP_CHECK(at(key).is_boolean(), name(key), " must be true or false, got ", at(key).dump());
    return at(key).get<bool>();
  }

  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    MMSP_CHECK(at(key).is_string(), name(key), " must be a string, got ", at(key).dump());
    return at(key).get<std::string>();
  }

  std::vector<int64_t> integers(const std::string& key, std::vector<int64_t> fallback, int64_t min = 0) const {
    if (!has(key)) return fallback;
    const nlohmann::json& v = at(key);
    MMSP_CHECK(v.is_array(), name(key), " must be a list of integers >= ", min, ", got ", v.dump());
    std::vector<int64_t> out;
    for (const nlohmann::json& e : v) out.push_back(checked_integer(e, key, min, v, true));
    return out;
  }

  // A nested object, or nullptr when the key is missing or null; anything else is an error.
  const nlohmann::json* object(const std::string& key) const {
    if (!has(key)) return nullptr;
    MMSP_CHECK(at(key).is_object(), name(key), " must be an object, got ", at(key).type_name());
    return &at(key);
  }

 private:
  // `shown` is what the message quotes: the value, or the whole list it sits in.
  int64_t checked_integer(const nlohmann::json& v, const std::string& key, int64_t min, const nlohmann::json& shown,
                          bool in_list) const {
    const char* rule = in_list ? " must be a list of integers " : " must be an integer ";
    const bool is_int = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX);
    MMSP_CHECK(is_int && v.get<int64_t>() >= min, name(key), rule, ">= ", min, ", got ", shown.dump());
    MMSP_CHECK(v.get<int64_t>() <= kMaxInteger, name(key), rule, "<= ", kMaxInteger, ", got ", shown.dump());
    return v.get<int64_t>();
  }

  const nlohmann::json& object_;
  std::string prefix_;
};

inline std::string join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace mmsp::model::json_fields
