// LoRA adapters on a model's linear maps; see lora.h.
#include "mmsp/model/lora.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "mmsp/core/check.h"
#include "mmsp/model/layers/expert_names.h"
#include "mmsp/model/layers/linear.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {
namespace {

std::string last_name(const std::string& module_name) {
  const size_t dot = module_name.rfind('.');
  return dot == std::string::npos ? module_name : module_name.substr(dot + 1);
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

}  // namespace

const std::vector<std::string>& default_lora_targets() {
  static const std::vector<std::string> targets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
  return targets;
}

std::vector<std::string> parse_lora_targets(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  std::string word;
  while (std::getline(in, word, ',')) {
    MMSP_CHECK(!word.empty(), "--lora-targets ", list, ": an empty name (give module names such as q_proj,v_proj)");
    out.push_back(word);
  }
  MMSP_CHECK(!list.empty() && list.back() != ',', "--lora-targets ", list, ": an empty name");
  return out;
}

std::string lora_targets_text(const std::vector<std::string>& targets) {
  std::string out;
  for (const std::string& t : targets) out += (out.empty() ? "" : ",") + t;
  return out;
}

bool is_lora_parameter(const std::string& name) {
  auto ends = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends(".lora_A.weight") || ends(".lora_B.weight");
}

std::vector<std::string> add_lora(Vlm& vlm, const LoraOptions& o) {
  MMSP_CHECK(o.rank >= 1, "--lora-rank ", o.rank, " must be ≥ 1 (the adapters' rank; leave it out for no LoRA)");
  MMSP_CHECK(std::isfinite(o.alpha) && o.alpha > 0, "--lora-alpha ", o.alpha,
             " must be a positive number (the adapters' scale is alpha / rank)");
  const std::vector<std::string>& targets = o.targets.empty() ? default_lora_targets() : o.targets;
  std::set<const torch::nn::Module*> in_decoder;
  for (const auto& m : vlm.decoder().modules()) in_decoder.insert(m.get());
  std::set<std::string> used;
  std::vector<std::string> adapted, decoder_maps;
  for (const auto& item : vlm.named_modules()) {
    auto linear = std::dynamic_pointer_cast<Linear>(item.value());
    if (!linear) continue;
    const bool decoder = in_decoder.count(item.value().get()) > 0;
    const std::string name = (decoder ? "" : "vision.") + last_name(item.key());
    // A mixture of experts' routed experts are one fused parameter a layer in transformers 5,
    // not linear modules: peft's target_modules never adapts them, and nor does mmsp (the
    // adapter directory then loads into peft; the shared expert and attention are adapted).
    if (is_expert_parameter(item.key() + ".")) continue;
    if (decoder && std::find(decoder_maps.begin(), decoder_maps.end(), name) == decoder_maps.end())
      decoder_maps.push_back(name);
    if (std::find(targets.begin(), targets.end(), name) == targets.end()) continue;
    MMSP_CHECK(!linear->has_lora(), "--lora-targets: ", item.key(), " has an adapter already");
    // A rank above min(in, out) is allowed, as peft allows it (all-linear adapts Qwen3.5-MoE's
    // 64 -> 1 shared_expert_gate at r 4): it adds no expressiveness but computes the same.
    linear->add_lora(o.rank, o.alpha);
    used.insert(name);
    adapted.push_back(item.key());
  }
  // A target naming only routed experts' maps is not an error (a Qwen3-VL-MoE without dense
  // layers has gate_proj only there), as peft adapts what matches.
  const bool moe = vlm.config().text.moe.any();
  for (const std::string& t : targets)
    MMSP_CHECK(used.count(t) || (moe && (t == "gate_proj" || t == "up_proj" || t == "down_proj")), "--lora-targets: \"",
               t, "\" names no linear map of this ", vlm.config().model_type, " model (the decoder's are ",
               join(decoder_maps), "; the vision tower's go by vision.NAME)");
  MMSP_CHECK(!adapted.empty(), "--lora-targets ", join(targets), " adapt no map of this ", vlm.config().model_type,
             " model (a mixture of experts' routed experts are not adapted; the decoder's maps are ",
             join(decoder_maps), ")");
  return adapted;
}

}  // namespace mmsp::model
