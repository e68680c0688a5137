// Model weights <-> safetensors files, by the parameters' Hugging Face names, so a
// checkpoint written here loads in transformers and one from there loads here.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <string>

namespace mmsp::model {

// Every parameter of `module`, by name, as a safetensors file (atomic write).
void save_weights(const torch::nn::Module& module, const std::string& path,
                  const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Copies the file's tensors into the parameters of the same names, converting the
// dtype to the parameter's. A parameter missing from the file, a tensor the model
// does not have, or a shape that differs is an error naming it; nothing is copied
// unless everything matches.
void load_weights(torch::nn::Module& module, const std::string& path);

}  // namespace mmsp::model
