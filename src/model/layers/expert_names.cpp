// Expert parameters by name; see expert_names.h.
#include "mmsp/model/layers/expert_names.h"

#include <cctype>

namespace mmsp::model {
namespace {

constexpr const char kExperts[] = ".mlp.experts.";
constexpr size_t kExpertsLength = sizeof(kExperts) - 1;

// [begin, end) of the digits after ".mlp.experts." when a '.' follows them; begin == end: none.
std::pair<size_t, size_t> index_digits(const std::string& name) {
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return {0, 0};
  const size_t begin = at + kExpertsLength;
  size_t end = begin;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == begin || end - begin > 9 || end == name.size() || name[end] != '.') return {0, 0};
  return {begin, end};
}

}  // namespace

bool is_expert_parameter(const std::string& name) { return name.find(kExperts) != std::string::npos; }

int64_t expert_index(const std::string& name) {
  const auto [begin, end] = index_digits(name);
  return begin == end ? -1 : std::stoll(name.substr(begin, end - begin));
}

std::string with_expert_index(const std::string& name, int64_t e) {
  const auto [begin, end] = index_digits(name);
  if (begin == end) return name;
  return name.substr(0, begin) + std::to_string(e) + name.substr(end);
}

}  // namespace mmsp::model
