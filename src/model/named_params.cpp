// Checks on named parameter lists; see named_params.h.
#include "mmsp/model/named_params.h"

#include <torch/nn/module.h>

#include <map>
#include <set>

#include "mmsp/core/check.h"

namespace mmsp::model {

NamedParams named_parameters(const torch::nn::Module& module) {
  NamedParams out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void check_named_params(const NamedParams& named_params, const char* who) {
  std::set<std::string> names;
  std::map<const void*, std::string> tensors;
  for (size_t i = 0; i < named_params.size(); ++i) {
    const auto& [name, tensor] = named_params[i];
    MMSP_CHECK(!name.empty(), who, ": parameter #", i, " has an empty name");
    MMSP_CHECK(names.insert(name).second, who, ": parameter name \"", name, "\" appears twice; names must be unique");
    MMSP_CHECK(tensor.defined(), who, ": parameter \"", name, "\" is an undefined tensor");
    auto [it, fresh] = tensors.emplace(tensor.unsafeGetTensorImpl(), name);
    MMSP_CHECK(fresh, who, ": parameter \"", name, "\" is the same tensor as \"", it->second,
               "\" (tied weights); pass each tensor once");
  }
}

}  // namespace mmsp::model
