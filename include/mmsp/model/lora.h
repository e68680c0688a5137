// LoRA adapters (--lora-rank, --lora-alpha, --lora-targets) put on a model's linear maps, as
// peft's LoraModel puts them (layers/linear.h: lora_A, lora_B, scale alpha / r, no dropout:
// training stays exact). A target names the maps by their last module name, as peft's
// target_modules list does: "q_proj" adapts every decoder layer's q_proj. The decoder's
// maps by default; a target "vision.NAME" adapts the vision tower's (its merger included).
// A mixture of experts' routed experts are never adapted (peft does not adapt transformers'
// fused experts through target_modules either); their shared expert is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mmsp::model {

class Vlm;

struct LoraOptions {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16;
  std::vector<std::string> targets;  // empty: default_lora_targets()
};

// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj: every projection of the
// decoder's attention and MLP, as LLaMA-Factory's lora_target all and ms-swift's all-linear
// give them for the language model.
const std::vector<std::string>& default_lora_targets();

// "q_proj,v_proj" into names; an empty name is an error naming the list.
std::vector<std::string> parse_lora_targets(const std::string& list);
// The inverse: "q_proj,v_proj", as --lora-targets takes them.
std::string lora_targets_text(const std::vector<std::string>& targets);

// Puts an adapter on every matching map of `vlm` (parameters drawn as the current
// ParameterInitScope says) and returns the adapted modules' names, in the model's order.
// A target that matches no linear map, a rank below 1 or a non-finite alpha is an error
// naming the value and the rule.
std::vector<std::string> add_lora(Vlm& vlm, const LoraOptions& options);

// Whether a parameter is a LoRA adapter's (its name ends in lora_A.weight or lora_B.weight).
bool is_lora_parameter(const std::string& name);

}  // namespace mmsp::model
