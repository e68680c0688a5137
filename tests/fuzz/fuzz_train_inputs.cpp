// libFuzzer entries for the train layer's JSON inputs (FUZZ_INPUT at compile time):
// 1 = state.json (check_train_state), 2 = one JSON-lines data line (JsonlDataset over
// a file holding it, images beside it). Any bytes must end in a result or an
// mmsp::Error. Built with clang; see tests/fuzz/CMakeLists.txt.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#if FUZZ_INPUT == 1
#include "mmsp/train/checkpoint/train_state.h"
#else
#include "mmsp/model/config/config.h"
#include "mmsp/train/data/jsonl_dataset.h"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
#if FUZZ_INPUT == 1
    mmsp::train::check_train_state(mmsp::parse_json_text(text, "state.json"), "state.json");
#else
    static const mmsp::model::ModelConfig config =
        mmsp::model::load_model_config(MMSP_SOURCE_DIR "/configs/tiny-qwen2-vl.json");
    static const std::string dir = [] {
      const char* tmp = std::getenv("TMPDIR");  // run.sh's scratch folder
      std::string name = std::string(tmp && *tmp ? tmp : "/tmp") + "/mmsp-fuzz-jsonl-XXXXXX";
      if (!::mkdtemp(name.data())) std::abort();
      for (const char* png : {"circle.png", "square.png", "triangle.png", "move_0.png", "move_1.png", "move_2.png"})
        std::filesystem::copy_file(std::string(MMSP_SOURCE_DIR "/examples/data/") + png, std::string(name) + "/" + png);
      return std::string(name);
    }();
    if (text.find('\n') != std::string::npos) return 0;  // one line
    std::ofstream(dir + "/data.jsonl", std::ios::trunc | std::ios::binary) << text << "\n";
    mmsp::train::JsonlDataset d(dir + "/data.jsonl", config);
#endif
  } catch (const mmsp::Error&) {}
  return 0;
}
