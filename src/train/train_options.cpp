// The values the training flags name, parsed once; see train_options.h.
#include "mmsp/train/train_options.h"

#include "mmsp/core/check.h"

namespace mmsp::train {

PrefetchPixels parse_prefetch_pixels(const std::string& name) {
  if (name == "off") return PrefetchPixels::off;
  if (name == "on") return PrefetchPixels::on;
  if (name == "auto") return PrefetchPixels::automatic;
  MMSP_FAIL("--prefetch-pixels '", name, "' must be off, on or auto");
}

std::string to_string(PrefetchPixels mode) {
  return mode == PrefetchPixels::off ? "off" : mode == PrefetchPixels::on ? "on" : "auto";
}

namespace {
std::optional<at::ScalarType> named_dtype(const std::string& name) {
  if (name == "float16" || name == "fp16") return at::kHalf;
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float64" || name == "fp64") return at::kDouble;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  return std::nullopt;
}
}  // namespace

at::ScalarType parse_compute_dtype(const std::string& name) {
  const std::optional<at::ScalarType> type = named_dtype(name);
  MMSP_CHECK(type && *type != at::kHalf, "--dtype '", name, "' must be float32, float64 or bfloat16");
  return *type;
}

std::optional<at::ScalarType> parse_save_dtype(const std::string& name) {
  if (name.empty()) return std::nullopt;
  const std::optional<at::ScalarType> type = named_dtype(name);
  MMSP_CHECK(type.has_value(), "--save-dtype '", name, "' must be bfloat16, float16, float32 or float64");
  return type;
}

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kHalf:
      return "float16";
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kBFloat16:
      return "bfloat16";
    default:
      return c10::toString(type);
  }
}

}  // namespace mmsp::train
