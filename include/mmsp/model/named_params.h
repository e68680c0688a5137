// Parameters by name, as the parallel and train layers take them: the model's
// named_parameters() in a fixed order, the same on every rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace mmsp::model {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

// The module's named_parameters(), in its order (a tied weight once).
NamedParams named_parameters(const torch::nn::Module& module);

// Throws mmsp::Error, prefixed with `who`, unless every tensor is defined, every
// name non-empty and unique, and no tensor appears twice (a tied weight is passed
// once: reducing or stepping it twice would double its update).
void check_named_params(const NamedParams& named_params, const char* who);

}  // namespace mmsp::model
