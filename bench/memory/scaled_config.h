// A released model config at a scale this machine can train: fewer decoder layers,
// fewer vision blocks, a smaller vocabulary, every other size as released. The bench
// states the scale in its flags (and rows) instead of in a hand-edited file.
#pragma once

#include <cstdint>
#include <string>

namespace mmsp::bench {

struct ConfigScale {
  int64_t layers = 0;         // decoder layers kept (0: all); Qwen3.5's layer_types cut to match
  int64_t vision_layers = 0;  // vision blocks kept (0: all); block index lists cut to match
  int64_t vocab = 0;          // vocab_size (0: as released); special token ids at or above it move to its top
  bool any() const { return layers > 0 || vision_layers > 0 || vocab > 0; }
};

// `model` (a config file) rewritten at `scale` into a temporary file named by `tag`, or
// `model` as it is when nothing is scaled. Values that cannot be scaled are named.
std::string scaled_config(const std::string& model, const ConfigScale& scale, const std::string& tag);

}  // namespace mmsp::bench
