// libFuzzer entry for the safetensors reader: any byte string must either parse or throw
// mmsp::Error. Anything else (a crash, a sanitizer report, another exception escaping)
// is a bug. Built with clang; tests/fuzz/run.sh runs it.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mmsp/core/check.h"
#include "mmsp/hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tensors = mmsp::hf::parse_safetensors(data, size, "fuzz");
    // A file that parses must write back to bytes that parse to the same tensors.
    const std::string again = mmsp::hf::serialize_safetensors(tensors);
    const auto reread = mmsp::hf::parse_safetensors(again.data(), again.size(), "fuzz-again");
    if (reread.size() != tensors.size()) __builtin_trap();
    for (const auto& [name, t] : tensors) {
      const at::Tensor& u = reread.at(name);
      if (u.scalar_type() != t.scalar_type() || u.sizes() != t.sizes() ||
          (t.numel() > 0 && std::memcmp(u.data_ptr(), t.data_ptr(), t.nbytes()) != 0))
        __builtin_trap();
    }
  } catch (const mmsp::Error&) {}
  return 0;
}
