// state.json checks and the CPU RNG state; see train_state.h.
#include "mmsp/train/checkpoint/train_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>

#include "mmsp/core/check.h"

namespace mmsp::train {
namespace {

using nlohmann::json;

constexpr int kVersion = 1;

int64_t non_negative(const json& j, const char* key, const std::string& where, const std::string& source) {
  MMSP_CHECK(j.contains(key), source, ": ", where, key, " is missing");
  const json& v = j.at(key);
  MMSP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, source, ": ", where, key, " (", v.dump(),
             ") must be an integer ≥ 0");
  return v.get<int64_t>();
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string brief(const std::string& s) { return s.size() > 40 ? s.substr(0, 40) + "..." : s; }

}  // namespace

json check_train_state(const json& j, const std::string& source) {
  MMSP_CHECK(j.is_object(), source, ": the train state must be a JSON object, got ", brief(j.dump()));
  for (const auto& [key, value] : j.items())
    MMSP_CHECK(key == "version" || key == "step" || key == "data" || key == "cpu_rng" || key == "run", source,
               ": unknown train-state field \"", key,
               "\" (fields: version, step, data, cpu_rng, run; free-form values go in run)");
  if (j.contains("version"))
    MMSP_CHECK(j.at("version") == kVersion, source, ": train-state version ", j.at("version").dump(),
               " is not supported (this build reads version ", kVersion, ")");
  non_negative(j, "step", "", source);
  MMSP_CHECK(j.contains("data") && j.at("data").is_object(), source,
             ": data must be an object {\"epoch\", \"offset\"}");
  non_negative(j.at("data"), "epoch", "data.", source);
  non_negative(j.at("data"), "offset", "data.", source);
  MMSP_CHECK(j.contains("cpu_rng") && j.at("cpu_rng").is_string(), source, ": cpu_rng must be a string (hex)");
  const std::string& rng = j.at("cpu_rng").get_ref<const std::string&>();
  bool hex = !rng.empty() && rng.size() % 2 == 0;
  for (char c : rng) hex = hex && hex_digit(c) >= 0;
  MMSP_CHECK(hex, source, ": cpu_rng (\"", brief(rng), "\") must be non-empty lower-case hex, two digits per byte");
  MMSP_CHECK(j.contains("run") && j.at("run").is_object(), source, ": run must be a JSON object, got ",
             j.contains("run") ? brief(j.at("run").dump()) : "nothing");
  json out = j;
  out["version"] = kVersion;
  return out;
}

std::string capture_cpu_rng() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor bytes;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    bytes = gen.get_state();  // uint8 [n]
  }
  static const char digits[] = "0123456789abcdef";
  const auto* p = bytes.data_ptr<uint8_t>();
  std::string out;
  out.reserve(2 * static_cast<size_t>(bytes.numel()));
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

void restore_cpu_rng(const std::string& hex, const std::string& source) {
  MMSP_CHECK(!hex.empty() && hex.size() % 2 == 0, source, ": cpu_rng has ", hex.size(),
             " hex digits; expected a non-empty, even count");
  at::Tensor bytes = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  auto* p = bytes.data_ptr<uint8_t>();
  for (size_t i = 0; i < hex.size() / 2; ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    MMSP_CHECK(hi >= 0 && lo >= 0, source, ": cpu_rng is not lower-case hex at digit ", 2 * i);
    p[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(bytes);
  } catch (const c10::Error& e) {
    throw Error(detail::concat(source, ": cpu_rng (", bytes.numel(),
                               " bytes) is not a CPU generator state of this LibTorch: ", e.what_without_backtrace()));
  }
}

}  // namespace mmsp::train
