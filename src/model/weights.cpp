// Weights by name; see weights.h.
#include "mmsp/model/weights.h"

#include <ATen/ATen.h>

#include "mmsp/core/check.h"
#include "mmsp/model/safetensors.h"

namespace mmsp::model {

void save_weights(const torch::nn::Module& module, const std::string& path,
                  const std::map<std::string, std::string>& metadata) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : module.named_parameters()) tensors[item.key()] = item.value().detach();
  save_safetensors(path, tensors, metadata);
}

void load_weights(torch::nn::Module& module, const std::string& path) {
  std::map<std::string, at::Tensor> file = load_safetensors(path);
  auto params = module.named_parameters();
  std::string missing, shapes;
  for (const auto& item : params) {
    auto it = file.find(item.key());
    if (it == file.end()) {
      missing += (missing.empty() ? "" : ", ") + item.key();
    } else if (it->second.sizes() != item.value().sizes()) {
      shapes += detail::concat(shapes.empty() ? "" : ", ", item.key(), " is ", it->second.sizes(),
                               " in the file but ", item.value().sizes(), " in the model");
    }
  }
  std::string unexpected;
  for (const auto& [name, tensor] : file)
    if (!params.contains(name)) unexpected += (unexpected.empty() ? "" : ", ") + name;
  MMSP_CHECK(missing.empty(), path, ": the model's parameters ", missing, " are not in the file");
  MMSP_CHECK(unexpected.empty(), path, ": the file's tensors ", unexpected,
             " are not parameters of the model (another model type or config?)");
  MMSP_CHECK(shapes.empty(), path, ": shapes differ: ", shapes);
  at::NoGradGuard no_grad;
  for (auto& item : params) item.value().copy_(file.at(item.key()));
}

}  // namespace mmsp::model
