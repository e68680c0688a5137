// peft's LoRA adapter directory; see peft_adapter.h.
#include "mmsp/hf/peft_adapter.h"

#include <ATen/ATen.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/hf/safetensors.h"

namespace mmsp::hf {

std::string module_names_pattern(const std::vector<std::string>& names) {
  std::set<std::string> forms;
  for (const std::string& name : names) {
    std::string form;
    for (size_t i = 0; i < name.size();) {
      if (std::isdigit(static_cast<unsigned char>(name[i]))) {
        while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
        form += "\\d+";
        continue;
      }
      if (name[i] == '.') form += "\\";
      form += name[i++];
    }
    forms.insert(form);
  }
  std::string out;
  for (const std::string& f : forms) out += (out.empty() ? "" : "|") + f;
  return forms.size() > 1 ? "(" + out + ")" : out;
}

std::string peft_adapter_config(const PeftAdapter& a) {
  nlohmann::json c = {{"peft_type", "LORA"},
                      {"task_type", nullptr},
                      {"base_model_name_or_path", a.base_model},
                      {"r", a.rank},
                      {"lora_alpha", a.alpha},
                      {"lora_dropout", 0.0},
                      {"target_modules", a.target_modules},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"use_rslora", false},
                      {"use_dora", false},
                      {"init_lora_weights", true},
                      {"inference_mode", true},
                      {"modules_to_save", nullptr},
                      {"layers_to_transform", nullptr},
                      {"layers_pattern", nullptr},
                      {"rank_pattern", nlohmann::json::object()},
                      {"alpha_pattern", nlohmann::json::object()},
                      {"revision", nullptr}};
  return c.dump(2) + "\n";
}

void save_peft_adapter(const std::string& dir, const PeftAdapter& a, std::optional<at::ScalarType> dtype) {
  MMSP_CHECK(a.rank >= 1 && !a.modules.empty(), "save_peft_adapter: ", dir, ": no adapter to write");
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [module, A, B] : a.modules) {
    MMSP_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(0) == a.rank && B.size(1) == a.rank,
               "save_peft_adapter: ", module, ": lora_A ", A.sizes(), " and lora_B ", B.sizes(), " are not of rank ",
               a.rank);
    const std::string key = "base_model.model." + module;
    tensors[key + ".lora_A.weight"] = (dtype ? A.to(*dtype) : A).detach().contiguous().cpu();
    tensors[key + ".lora_B.weight"] = (dtype ? B.to(*dtype) : B).detach().contiguous().cpu();
  }
  std::filesystem::create_directories(dir);
  save_safetensors(dir + "/" + kPeftWeightsFile, tensors, {{"format", "pt"}});
  const std::string config = dir + "/" + kPeftConfigFile, tmp = config + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << peft_adapter_config(a);
    MMSP_CHECK(out.good(), tmp, ": cannot write the adapter's config");
  }
  std::filesystem::rename(tmp, config);
}

}  // namespace mmsp::hf
