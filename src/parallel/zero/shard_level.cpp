// --shard's names; see shard_level.h.
#include "mmsp/parallel/zero/shard_level.h"

#include "mmsp/core/check.h"

namespace mmsp::parallel {

ShardLevel parse_shard_level(const std::string& name) {
  if (name == "none") return ShardLevel::none;
  if (name == "optimizer") return ShardLevel::optimizer;
  if (name == "gradients") return ShardLevel::gradients;
  if (name == "parameters") return ShardLevel::parameters;
  MMSP_FAIL("--shard \"", name, "\" is unknown; use none, optimizer (ZeRO-1), gradients (ZeRO-2) or ",
            "parameters (ZeRO-3)");
}

const char* to_string(ShardLevel level) {
  switch (level) {
    case ShardLevel::none:
      return "none";
    case ShardLevel::optimizer:
      return "optimizer";
    case ShardLevel::gradients:
      return "gradients";
    case ShardLevel::parameters:
      return "parameters";
  }
  return "?";
}

}  // namespace mmsp::parallel
