// Private to src/hf: the small helpers opening a directory and loading its weights share.
#pragma once

#include <ATen/core/Tensor.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace mmsp::hf::io {

inline std::string errno_text() { return std::strerror(errno); }

inline std::string join(const std::string& dir, const std::string& file) {
  return dir.empty() || dir.back() == '/' ? dir + file : dir + "/" + file;
}

inline bool loadable_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace mmsp::hf::io
