// Vision mode names; see vision_mode.h.
#include "mmsp/model/vision/vision_mode.h"

#include "mmsp/core/check.h"

namespace mmsp::model {

VisionMode parse_vision_mode(const std::string& name) {
  if (name == "routed") return VisionMode::routed;
  if (name == "gather") return VisionMode::gather;
  if (name == "replicate") return VisionMode::replicate;
  MMSP_FAIL("vision mode '", name, "' must be routed, gather or replicate");
}

const char* to_string(VisionMode mode) {
  switch (mode) {
    case VisionMode::routed:
      return "routed";
    case VisionMode::gather:
      return "gather";
    case VisionMode::replicate:
      return "replicate";
  }
  return "?";
}

}  // namespace mmsp::model
