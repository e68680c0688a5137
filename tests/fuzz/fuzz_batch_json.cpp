// libFuzzer entry for batch.json as `mmsp plan` reads it: any bytes must end in a plan or
// an mmsp::Error (anything else — a crash, a sanitizer report, another exception — is a
// bug). Built with clang; see tests/fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <string>

#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#include "mmsp/model/family.h"
#include "mmsp/plan/model_conventions.h"
#include "mmsp/plan/plan_json.h"
#include "mmsp/plan/step_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mmsp::plan::ModelConventions conventions =
      mmsp::model::conventions_from_config(mmsp::read_json_file(MMSP_SOURCE_DIR "/configs/tiny-qwen2-vl.json"));
  try {
    const auto batch = mmsp::plan::batch_from_json(
        mmsp::parse_json_text(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json"));
    mmsp::plan::PlanOptions options;
    options.mesh = {1, 2, 2};
    const auto plan = mmsp::plan::make_step_plan(batch, conventions, options, 3);
    (void)plan;
  } catch (const mmsp::Error&) {}
  return 0;
}
