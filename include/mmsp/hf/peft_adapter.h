// peft's LoRA adapter directory, as PeftModel.save_pretrained writes it and
// PeftModel.from_pretrained(base_model, dir) reads it: adapter_config.json (a LoraConfig)
// and adapter_model.safetensors, whose keys are "base_model.model." + the transformers
// model's module name + ".lora_A.weight" / ".lora_B.weight" (the adapter's own name left
// out). Which modules, and their names, are the caller's (model/peft_naming.h).
// Read back (`mmsp train --model ADAPTER_DIR`): the config's LoRA settings, the adapted
// modules from the weights file's keys, and the file's tensors as a directory to load from.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mmsp/hf/hf_directory.h"

namespace mmsp::hf {

constexpr const char* kPeftConfigFile = "adapter_config.json";
constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";

struct PeftAdapter {
  int64_t rank = 0;
  double alpha = 0;
  // peft's target_modules as a regular expression over the transformers model's module names
  // (peft full-matches it): exactly the modules that hold an adapter, so that peft puts
  // adapters nowhere else (a list of names would also catch a vision tower's q_proj).
  std::string target_modules;
  std::string base_model;  // base_model_name_or_path: where the base came from (informative)
  // (transformers module name of the adapted map, lora_A [r, in], lora_B [out, r])
  std::vector<std::tuple<std::string, at::Tensor, at::Tensor>> modules;
};

// adapter_config.json's text (LoRA, no dropout, no bias, the default scaling alpha / r).
std::string peft_adapter_config(const PeftAdapter& adapter);

// Writes `dir` (created; files replaced atomically) in `dtype` (the tensors' own when unset).
void save_peft_adapter(const std::string& dir, const PeftAdapter& adapter,
                       std::optional<at::ScalarType> dtype = std::nullopt);

// A regular expression that full-matches exactly `names` (module names): each name with its
// digit runs generalised to \d+ (the layers), the distinct forms joined by |.
std::string module_names_pattern(const std::vector<std::string>& names);

// ---- reading ----

// True when `path` is a directory holding adapter_config.json and no config.json (a model
// directory has config.json; an adapter directory, as peft writes it, has not).
bool is_peft_adapter_directory(const std::string& path);

// An adapter directory as mmsp can continue it: a LoRA whose scale is alpha / r on plain
// linear maps. peft options that change that computation (DoRA, rsLoRA, per-module ranks or
// alphas, LoRA biases, modules_to_save, fan_in_fan_out, adapters on parameters, ...) are
// refused, naming the field and its value.
struct PeftAdapterFiles {
  std::string dir;
  int64_t rank = 0;
  double alpha = 0;
  double dropout = 0;      // peft's lora_dropout: mmsp trains without it (exact)
  std::string base_model;  // base_model_name_or_path as written
  // The adapted modules by the transformers model's names (the keys less "base_model.model."
  // and ".lora_A.weight"), sorted; each has lora_A [r, in] and lora_B [out, r].
  std::vector<std::string> modules;
  HfDirectory weights;  // adapter_model.safetensors, by the file's own names
};

// Opens and checks `dir` (the config and the weights file's header; no tensor is read).
// Errors name the file, the field or key and the rule.
PeftAdapterFiles open_peft_adapter(const std::string& dir);

}  // namespace mmsp::hf
