// transformers 5's in-memory names of mmsp's parameters; see peft_naming.h.
#include "mmsp/model/peft_naming.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "mmsp/model/family.h"

namespace mmsp::model {
namespace {

using Prefixes = std::vector<std::pair<std::string, std::string>>;  // (mmsp, transformers), first match wins

// Read off transformers 5.17's modeling files (the attribute paths of each
// *ForConditionalGeneration) and checked against peft's saved keys (tests/hf/test_peft.py).
const Prefixes& prefixes_of(const ModelConfig& c) {
  static const Prefixes qwen2 = {{"visual.", "model.visual."}, {"model.", "model.language_model."}};
  static const Prefixes same = {};  // Qwen3-VL, Qwen3.5: mmsp's names are transformers' own
  static const Prefixes llava = {{"vision_tower.vision_model.", "model.vision_tower."},
                                 {"multi_modal_projector.", "model.multi_modal_projector."},
                                 {"language_model.model.", "model.language_model."},
                                 {"language_model.lm_head.", "lm_head."}};
  static const Prefixes internvl = {{"vision_tower.", "model.vision_tower."},
                                    {"multi_modal_projector.", "model.multi_modal_projector."},
                                    {"language_model.model.", "model.language_model."},
                                    {"language_model.lm_head.", "lm_head."}};
  const std::string family = family_for(c.model_type).name();
  if (family == "llava") return llava;
  if (family == "internvl") return internvl;
  return c.model_type == "qwen2_vl" || c.model_type == "qwen2_5_vl" ? qwen2 : same;
}

}  // namespace

std::string transformers_name(const ModelConfig& config, const std::string& mmsp_name) {
  for (const auto& [ours, theirs] : prefixes_of(config))
    if (mmsp_name.rfind(ours, 0) == 0) return theirs + mmsp_name.substr(ours.size());
  return mmsp_name;
}

hf::CheckpointNaming peft_adapter_naming(const ModelConfig& config) {
  const std::string peft = "base_model.model.";
  hf::CheckpointNaming naming;
  for (const auto& [ours, theirs] : prefixes_of(config)) naming.prefix_aliases.emplace_back(peft + theirs, ours);
  naming.prefix_aliases.emplace_back(peft, "");
  return naming;
}

std::vector<std::string> lora_targets_of(const std::vector<std::string>& transformers_modules) {
  // Where transformers 5 keeps the towers and projectors of the six families.
  static const std::vector<std::string> outside_decoder = {"model.visual.", "model.vision_tower.",
                                                           "model.multi_modal_projector."};
  std::vector<std::string> out;
  for (const std::string& module : transformers_modules) {
    const size_t dot = module.rfind('.');
    std::string target = dot == std::string::npos ? module : module.substr(dot + 1);
    for (const std::string& p : outside_decoder)
      if (module.rfind(p, 0) == 0) target = "vision." + target;
    if (std::find(out.begin(), out.end(), target) == out.end()) out.push_back(target);
  }
  return out;
}

}  // namespace mmsp::model
