// peft's LoRA adapter directory; see peft_adapter.h.
#include "mmsp/hf/peft_adapter.h"

#include <ATen/ATen.h>

#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hf_io.h"
#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
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

// ---- reading ----

namespace {

using nlohmann::json;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A field whose non-default value changes what the adapter computes: refused, naming it.
// `unset` says whether the value is the default (absent counts as the default).
void refuse_unless_default(const json& c, const std::string& file, const char* field, const char* what,
                           bool (*unset)(const json&)) {
  if (!c.contains(field) || unset(c.at(field))) return;
  throw Error(detail::concat(file, ": ", field, " is ", c.at(field).dump(), ": ", what,
                             " is not supported (mmsp trains plain LoRA, scale lora_alpha / r); ",
                             "continue this adapter with peft, or start a new one with --lora-rank"));
}

bool null_or_false(const json& v) { return v.is_null() || (v.is_boolean() && !v.get<bool>()); }
bool null_or_empty(const json& v) { return v.is_null() || (v.is_structured() && v.empty()); }

json read_config(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  MMSP_CHECK(in.good(), file, ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  json c = parse_json_text(text.str(), file);
  MMSP_CHECK(c.is_object(), file, ": must be a JSON object (a peft adapter's config), got ", c.type_name());
  return c;
}

// A string field, "" when absent or null; another type is refused naming the field.
std::string string_field(const json& c, const std::string& file, const char* field, const char* fallback) {
  if (!c.contains(field) || c.at(field).is_null()) return fallback;
  MMSP_CHECK(c.at(field).is_string(), file, ": ", field, " is ", c.at(field).dump(), "; it must be a string");
  return c.at(field).get<std::string>();
}

// peft's options that change what an adapter computes, refused unless at their default.
struct RefusedOption {
  const char* field;
  const char* what;
  bool (*unset)(const json&);
};
const RefusedOption kRefusedOptions[] = {
    {"use_dora", "DoRA", null_or_false},
    {"use_rslora", "rank-stabilised LoRA (scale lora_alpha / sqrt(r))", null_or_false},
    {"use_qalora", "QALoRA", null_or_false},
    {"lora_bias", "a bias on lora_B", null_or_false},
    {"fan_in_fan_out", "a transposed (Conv1D) weight layout", null_or_false},
    {"modules_to_save", "training whole modules beside the adapters", null_or_empty},
    {"rank_pattern", "a rank per module", null_or_empty},
    {"alpha_pattern", "an alpha per module", null_or_empty},
    {"layer_replication", "replicated layers", null_or_empty},
    {"trainable_token_indices", "training token embeddings", null_or_empty},
    {"target_parameters", "adapters on parameters (a mixture of experts' fused experts)", null_or_empty},
    {"alora_invocation_tokens", "activated LoRA", null_or_empty},
    {"layers_to_transform", "adapters on some layers only", null_or_empty},
    {"use_bdlora", "block-diagonal LoRA", null_or_false},
    {"kasa_config", "KaSA", null_or_empty},
    {"monteclora_config", "MonteCLoRA", null_or_empty},
    {"velora_config", "VeLoRA", null_or_empty},
};

// The LoRA settings of the config, each checked (see PeftAdapterFiles).
void read_lora_settings(const json& c, const std::string& file, PeftAdapterFiles& out) {
  const std::string type = string_field(c, file, "peft_type", "");
  MMSP_CHECK(type == "LORA", file, ": peft_type is \"", type, "\"; mmsp continues LoRA adapters only (\"LORA\")");
  MMSP_CHECK(c.contains("r") && c.at("r").is_number_integer() && c.at("r").get<int64_t>() >= 1 &&
                 c.at("r").get<int64_t>() <= (int64_t{1} << 20),
             file, ": r is ", c.contains("r") ? c.at("r").dump() : "missing",
             "; it must be an integer in [1, 2^20] (the adapters' rank)");
  out.rank = c.at("r").get<int64_t>();
  MMSP_CHECK(c.contains("lora_alpha") && c.at("lora_alpha").is_number(), file, ": lora_alpha is ",
             c.contains("lora_alpha") ? c.at("lora_alpha").dump() : "missing",
             "; it must be a number (the scale is lora_alpha / r)");
  out.alpha = c.at("lora_alpha").get<double>();
  MMSP_CHECK(std::isfinite(out.alpha) && out.alpha > 0, file, ": lora_alpha ", out.alpha, " must be positive");
  if (c.contains("lora_dropout") && !c.at("lora_dropout").is_null()) {
    MMSP_CHECK(c.at("lora_dropout").is_number(), file, ": lora_dropout is ", c.at("lora_dropout").dump(),
               "; it must be a number");
    out.dropout = c.at("lora_dropout").get<double>();
    MMSP_CHECK(out.dropout >= 0 && out.dropout < 1, file, ": lora_dropout ", out.dropout, " must be in [0, 1)");
  }
  const std::string bias = string_field(c, file, "bias", "none");
  MMSP_CHECK(bias == "none", file, ": bias is \"", bias, "\": trained biases beside the adapters are not supported ",
             "(mmsp trains plain LoRA, bias \"none\")");
  for (const RefusedOption& r : kRefusedOptions) refuse_unless_default(c, file, r.field, r.what, r.unset);
  out.base_model = string_field(c, file, "base_model_name_or_path", "");
}

}  // namespace

bool is_peft_adapter_directory(const std::string& path) {
  return is_file(io::join(path, kPeftConfigFile)) && !is_file(io::join(path, "config.json"));
}

PeftAdapterFiles open_peft_adapter(const std::string& dir) {
  const std::string file = io::join(dir, kPeftConfigFile);
  const json c = read_config(file);
  PeftAdapterFiles out;
  out.dir = dir;
  read_lora_settings(c, file, out);

  const std::string weights = io::join(dir, kPeftWeightsFile);
  MMSP_CHECK(is_file(weights), dir, ": has no ", kPeftWeightsFile,
             " (peft's save_pretrained writes one; adapter_model.bin is not read)");
  const SafetensorsHeader header = read_safetensors_header(weights);
  out.weights.path = dir;
  out.weights.files = {kPeftWeightsFile};
  const std::string prefix = "base_model.model.", kA = ".lora_A.weight", kB = ".lora_B.weight";
  std::map<std::string, std::pair<const SafetensorsEntry*, const SafetensorsEntry*>> by_module;
  for (const auto& [name, entry] : header.tensors) {
    const bool a = ends_with(name, kA), b = ends_with(name, kB);
    MMSP_CHECK(name.rfind(prefix, 0) == 0 && (a || b) && name.size() > prefix.size() + kA.size(), weights,
               ": tensor \"", name, "\" is not a LoRA weight (", prefix, "MODULE", kA, " or ", kB,
               "): mmsp continues adapters on linear maps only");
    MMSP_CHECK(io::loadable_dtype(entry.scalar_type), weights, ": tensor \"", name, "\" has dtype ", entry.dtype,
               "; adapters load from F32, F16, BF16 or F64 only");
    const std::string module = name.substr(prefix.size(), name.size() - prefix.size() - kA.size());
    (a ? by_module[module].first : by_module[module].second) = &entry;
    out.weights.tensors.emplace(name, HfTensor{kPeftWeightsFile, entry, 8 + header.header_bytes + entry.data_begin});
    out.weights.total_bytes += entry.data_end - entry.data_begin;
  }
  MMSP_CHECK(!by_module.empty(), weights, ": holds no adapter");
  for (const auto& [module, ab] : by_module) {
    MMSP_CHECK(ab.first && ab.second, weights, ": ", module, " has ", ab.first ? "lora_A" : "lora_B", " but no ",
               ab.first ? "lora_B" : "lora_A");
    const std::vector<int64_t>&A = ab.first->shape, &B = ab.second->shape;
    MMSP_CHECK(A.size() == 2 && B.size() == 2 && A[0] == out.rank && B[1] == out.rank, weights, ": ", module,
               "'s lora_A ", io::shape_text(A), " and lora_B ", io::shape_text(B), " are not of rank r = ", out.rank,
               " (", kPeftConfigFile, "): lora_A must be [r, in], lora_B [out, r]");
    out.modules.push_back(module);
  }
  return out;
}

}  // namespace mmsp::hf
