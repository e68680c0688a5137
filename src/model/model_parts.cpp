// A VLM's parameters by part; see model_parts.h.
#include "mmsp/model/model_parts.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "mmsp/core/check.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {
namespace {

const std::vector<std::pair<ModelPart, const char*>>& part_names() {
  static const std::vector<std::pair<ModelPart, const char*>> names = {{ModelPart::vision, "vision"},
                                                                       {ModelPart::merger, "merger"},
                                                                       {ModelPart::llm, "llm"},
                                                                       {ModelPart::embeddings, "embeddings"}};
  return names;
}

// Inside the tower, the projector by the names the families give it: Qwen-VL's
// "visual.merger.*" and "visual.deepstack_merger_list.*" (under "model." for Qwen3-VL and
// Qwen3.5), LLaVA's and InternVL's "multi_modal_projector.*".
bool is_projector(const std::string& name) {
  return name.rfind("multi_modal_projector.", 0) == 0 || name.find("visual.merger.") != std::string::npos ||
         name.find("visual.deepstack_merger_list.") != std::string::npos;
}

}  // namespace

std::string to_string(ModelPart part) {
  for (const auto& [p, name] : part_names())
    if (p == part) return name;
  return "?";
}

std::vector<ModelPart> parse_model_parts(const std::string& list, const std::string& flag) {
  std::vector<ModelPart> out;
  if (list.empty()) return out;
  std::stringstream in(list);
  std::string word;
  while (std::getline(in, word, ',')) {
    auto it = std::find_if(part_names().begin(), part_names().end(), [&](const auto& p) { return word == p.second; });
    MMSP_CHECK(it != part_names().end(), flag, " ", list, ": \"", word,
               "\" is not a part of the model; the parts are vision, merger, llm and embeddings");
    MMSP_CHECK(std::find(out.begin(), out.end(), it->first) == out.end(), flag, " ", list, ": \"", word,
               "\" is named twice");
    out.push_back(it->first);
  }
  MMSP_CHECK(!list.empty() && list.back() != ',', flag, " ", list, ": an empty part name");
  return out;
}

std::string to_string(const std::vector<ModelPart>& parts) {
  std::string out;
  for (ModelPart p : parts) out += (out.empty() ? "" : ",") + to_string(p);
  return out;
}

std::vector<ModelPart> parameter_parts(const Vlm& vlm, const NamedParams& params) {
  std::set<const void*> decoder;
  for (const auto& item : vlm.decoder().named_parameters()) decoder.insert(item.value().unsafeGetTensorImpl());
  const void* embedding = vlm.decoder().model->embed_tokens->weight.unsafeGetTensorImpl();
  std::vector<ModelPart> out;
  out.reserve(params.size());
  for (const auto& [name, p] : params) {
    const void* impl = p.unsafeGetTensorImpl();
    out.push_back(impl == embedding     ? ModelPart::embeddings
                  : decoder.count(impl) ? ModelPart::llm
                  : is_projector(name)  ? ModelPart::merger
                                        : ModelPart::vision);
  }
  return out;
}

}  // namespace mmsp::model
