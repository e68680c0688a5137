// libFuzzer entries for the model layer's JSON inputs (one binary per input, chosen at
// compile time by FUZZ_INPUT): 1 = config.json (parse_model_config), 2 = the HF index
// (hf::open_hf_directory over two fixed shards). Any bytes must end in a result or an
// mmsp::Error. Built with clang; see tests/fuzz/CMakeLists.txt.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#if FUZZ_INPUT == 1
#include "mmsp/model/config/config.h"
#else
#include <ATen/ATen.h>

#include "mmsp/hf/hf_directory.h"
#include "mmsp/hf/safetensors.h"
#endif

#if FUZZ_INPUT == 2
namespace {
// A directory with config.json and two shards; the fuzzer writes its index.
std::string make_dir() {
  // under $TMPDIR, which run.sh points at its scratch folder, so the folder goes with it
  const char* tmp = std::getenv("TMPDIR");
  std::string name = std::string(tmp && *tmp ? tmp : "/tmp") + "/mmsp-fuzz-index-XXXXXX";
  if (!::mkdtemp(name.data())) std::abort();
  const std::string dir = name;
  std::ofstream(dir + "/config.json") << "{\"model_type\": \"tiny\"}";
  mmsp::hf::save_safetensors(dir + "/s1.safetensors", {{"a", at::ones({4})}}, {{"format", "pt"}});
  mmsp::hf::save_safetensors(dir + "/s2.safetensors", {{"b", at::ones({4})}}, {{"format", "pt"}});
  return dir;
}
}  // namespace
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
#if FUZZ_INPUT == 1
    mmsp::model::parse_model_config(mmsp::parse_json_text(text, "config.json"), "config.json");
#else
    static const std::string dir = make_dir();
    std::ofstream(dir + "/model.safetensors.index.json", std::ios::trunc | std::ios::binary) << text;
    mmsp::hf::open_hf_directory(dir);
#endif
  } catch (const mmsp::Error&) {}
  return 0;
}
