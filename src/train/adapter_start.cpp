// A run that continues a peft LoRA adapter; see adapter_start.h.
#include "mmsp/train/adapter_start.h"

#include <algorithm>

#include "mmsp/core/check.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/hf/peft_adapter.h"
#include "mmsp/model/lora.h"
#include "mmsp/model/peft_naming.h"

namespace mmsp::train {
namespace {

bool same_targets(std::vector<std::string> a, std::vector<std::string> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

}  // namespace

void start_from_peft_adapter(TrainOptions& o, const AdapterFlags& given) {
  const std::string dir = o.inputs.model;
  if (!hf::is_peft_adapter_directory(dir)) {
    MMSP_CHECK(given.base_model.empty(), "--base-model ", given.base_model,
               " names the base of a peft adapter directory given as --model, but --model ", dir,
               " is not one (it has no adapter_config.json, or has a config.json)");
    return;
  }
  const hf::PeftAdapterFiles adapter = hf::open_peft_adapter(dir);
  const std::vector<std::string> targets = model::lora_targets_of(adapter.modules);
  model::LoraOptions& lora = o.finetune.lora;
  MMSP_CHECK(!given.rank || lora.rank == adapter.rank, "--lora-rank ", lora.rank, " contradicts --model ", dir,
             ", an adapter of r = ", adapter.rank, ": leave --lora-rank out to continue it");
  MMSP_CHECK(!given.alpha || lora.alpha == adapter.alpha, "--lora-alpha ", lora.alpha, " contradicts --model ", dir,
             ", an adapter of lora_alpha = ", adapter.alpha, ": leave --lora-alpha out to continue it");
  MMSP_CHECK(!given.targets || same_targets(lora.targets, targets), "--lora-targets ",
             model::lora_targets_text(lora.targets), " contradicts --model ", dir, ", whose adapters are on ",
             model::lora_targets_text(targets), ": leave --lora-targets out to continue it");
  lora.rank = adapter.rank;
  lora.alpha = adapter.alpha;
  lora.targets = targets;
  o.finetune.lora_adapter = dir;
  const std::string base = given.base_model.empty() ? adapter.base_model : given.base_model;
  MMSP_CHECK(!base.empty(), dir, "/", hf::kPeftConfigFile,
             " names no base_model_name_or_path: give the base model directory with --base-model DIR");
  MMSP_CHECK(hf::is_hf_directory(base), "--model ", dir, ": its base model ", base,
             given.base_model.empty() ? " (adapter_config.json's base_model_name_or_path)" : " (--base-model)",
             " is not a model directory here (mmsp reads local directories that hold config.json): "
             "give the base with --base-model DIR");
  o.inputs.model = base;
}

}  // namespace mmsp::train
