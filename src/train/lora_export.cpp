// A LoRA run's merged model and peft adapter; see lora_export.h.
#include "lora_export.h"

#include <ATen/ATen.h>

#include <map>

#include "mmsp/core/check.h"
#include "mmsp/hf/checksum_manifest.h"
#include "mmsp/hf/peft_adapter.h"
#include "mmsp/model/peft_naming.h"

namespace mmsp::train {
namespace {

const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";

// Each adapted map's module name -> its (A, B), in the weights' order.
std::vector<std::tuple<std::string, at::Tensor, at::Tensor>> adapters_of(const model::NamedParams& weights) {
  std::map<std::string, at::Tensor> by_name(weights.begin(), weights.end());
  std::vector<std::tuple<std::string, at::Tensor, at::Tensor>> out;
  for (const auto& [name, w] : weights) {
    if (name.size() <= kA.size() || name.compare(name.size() - kA.size(), kA.size(), kA) != 0) continue;
    const std::string module = name.substr(0, name.size() - kA.size());
    const auto b = by_name.find(module + kB);
    MMSP_ASSERT(b != by_name.end(), "LoRA adapter ", module, " has lora_A but no lora_B");
    out.emplace_back(module, w, b->second);
  }
  return out;
}

}  // namespace

model::NamedParams merged_weights(const model::NamedParams& weights, const model::LoraOptions& lora) {
  const double scale = lora.alpha / static_cast<double>(lora.rank);
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> delta_of;
  for (const auto& [module, A, B] : adapters_of(weights)) delta_of[module + ".weight"] = {A, B};
  at::NoGradGuard no_grad;
  model::NamedParams out;
  for (const auto& [name, w] : weights) {
    if (model::is_lora_parameter(name)) continue;
    const auto d = delta_of.find(name);
    if (d == delta_of.end()) {
      out.emplace_back(name, w);
      continue;
    }
    // in fp64 for an fp64 weight, else fp32 (peft's merge upcasts 16-bit weights alike)
    const at::ScalarType wide = w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor delta = at::matmul(d->second.second.to(wide), d->second.first.to(wide)) * scale;
    out.emplace_back(name, (w.to(wide) + delta).to(w.scalar_type()));
  }
  return out;
}

void add_lora_outputs(CheckpointOptions& ckpt, const TrainOptions& o, const model::ModelConfig& config,
                      const std::string& base, WeightUpdate& update, const dist::Mesh& mesh) {
  const model::LoraOptions& lora = o.finetune.lora;
  if (lora.rank == 0) return;
  update.gather_weights();  // every rank: under --shard parameters a collective
  if (mesh.rank() != 0) return;
  const model::NamedParams weights = update.weights();
  ckpt.hf_weights = merged_weights(weights, lora);
  hf::PeftAdapter adapter;
  adapter.rank = lora.rank;
  adapter.alpha = lora.alpha;
  adapter.base_model = base;
  std::vector<std::string> modules;
  for (const auto& [module, A, B] : adapters_of(weights)) {
    modules.push_back(model::transformers_name(config, module));
    adapter.modules.emplace_back(modules.back(), A.detach().clone(), B.detach().clone());
  }
  adapter.target_modules = hf::module_names_pattern(modules);
  const std::optional<at::ScalarType> dtype = ckpt.save_dtype;
  ckpt.extra = [adapter, dtype](const std::string& step_dir) {
    hf::save_peft_adapter(step_dir + "/adapter", adapter, dtype);
    hf::ChecksumManifest listed;
    for (const char* file : {hf::kPeftConfigFile, hf::kPeftWeightsFile})
      listed[std::string("adapter/") + file] = hf::checksum_of_file(step_dir + "/adapter/" + file);
    return listed;
  };
}

}  // namespace mmsp::train
