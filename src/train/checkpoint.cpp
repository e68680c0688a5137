// Atomic checkpoints; see checkpoint.h. The files are written by checkpoint_io.
#include "mmsp/train/checkpoint.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "checkpoint_io.h"
#include "mmsp/core/check.h"
#include "mmsp/model/safetensors.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kLatest = "latest";
constexpr const char* kTmpMark = ".tmp-";  // in every temporary name, and only there

// "step-000042" -> 42; anything else -> nullopt.
std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return {};
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return {};
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string read_text(const std::string& path) {
  MMSP_CHECK(fs::is_regular_file(path), path,
             ": missing (an incomplete checkpoint, or not a checkpoint directory)");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  MMSP_CHECK(in.good() || in.eof(), path, ": cannot read");
  return text.str();
}

json parse_json(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(detail::concat(path, ": not valid JSON (corrupted?): ", e.what()));
  }
}

// Leftovers of crashed saves: hidden names carrying the temporary mark.
void remove_leftovers(const std::string& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name[0] == '.' && name.find(kTmpMark) != std::string::npos) fs::remove_all(entry.path());
  }
}

// A step dir a resume could load: state.json parses, passes check_train_state and
// names the dir's step, and the other files are there and not empty. (Reading every
// tensor is load_checkpoint's job; this is the cheap test that --keep relies on.)
bool looks_complete(const fs::path& step_dir, int64_t step) {
  try {
    for (const char* file : {kModelFile, kOptimizerFile, kConfigFile}) {
      std::error_code ec;
      if (!fs::is_regular_file(step_dir / file, ec) || fs::file_size(step_dir / file, ec) == 0 || ec) return false;
    }
    const std::string state_path = (step_dir / kStateFile).string();
    const json state = check_train_state(parse_json(read_text(state_path), state_path), state_path);
    return state.at("step").get<int64_t>() == step;
  } catch (const std::exception&) {
    return false;
  }
}

// Keeps the newest `keep_last` complete step dirs up to `step` and deletes the older
// ones, complete or not. Incomplete dirs newer than the oldest kept one are left for
// inspection, and never count: a corrupt newer dir cannot push out the last good one.
// Step dirs after `step` are left alone (a run that went further before a resume).
void apply_keep_last(const std::string& dir, int64_t step, int keep_last) {
  if (keep_last <= 0) return;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto s = parse_step_dir_name(entry.path().filename().string());
    if (s && *s <= step && entry.is_directory()) steps.emplace_back(*s, entry.path());
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  int kept = 0;
  for (const auto& [s, path] : steps) {
    if (kept >= keep_last) fs::remove_all(path);
    else if (looks_complete(path, s)) ++kept;
  }
  checkpoint_io::sync_dir(dir);
}

std::map<std::string, at::Tensor> model_tensors(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().detach();
  return out;
}

std::string names_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::string step_dir_name(int64_t step) {
  MMSP_CHECK(step >= 0, "checkpoint step (", step, ") must be ≥ 0");
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step));
  return name;
}

void save_checkpoint(const std::string& dir, int64_t step, const torch::nn::Module& model,
                     const torch::optim::AdamW& optimizer, const json& state,
                     const std::string& config_json, const CheckpointOptions& options) {
  const std::string name = step_dir_name(step);
  MMSP_CHECK(options.keep_last >= 0, "save_checkpoint: keep_last (", options.keep_last,
             ") must be ≥ 0 (0 keeps every checkpoint)");
  // Everything that can be refused is refused before a file is touched.
  MMSP_CHECK(state.is_object(), "save_checkpoint: state must be a JSON object (train_state.h)");
  json full = state;
  if (!full.contains("step")) full["step"] = step;
  MMSP_CHECK(full["step"] == step, "save_checkpoint: state.step (", full["step"].dump(),
             ") differs from the step being saved (", step, ")");
  if (!full.contains("cpu_rng")) full["cpu_rng"] = capture_cpu_rng();
  const json train_state = check_train_state(full, "save_checkpoint: state");
  const json config = parse_json(config_json, "save_checkpoint: config_json");
  MMSP_CHECK(config.is_object(), "save_checkpoint: config_json must be a JSON object");
  const AdamWState adamw = capture_adamw_state(optimizer, model);

  fs::create_directories(dir);
  remove_leftovers(dir);
  const std::string tmp = dir + "/." + name + kTmpMark + std::to_string(::getpid());
  const std::string final_dir = dir + "/" + name;
  MMSP_CHECK(fs::create_directory(tmp), tmp, ": cannot create the temporary checkpoint dir");
  checkpoint_io::DurableWriter writer(options.crash_after_bytes, kCheckpointCrashExitCode);
  try {
    writer.write_safetensors(tmp + "/" + kModelFile, model_tensors(model), {{"format", "pt"}});
    writer.write_safetensors(tmp + "/" + kOptimizerFile, adamw_state_tensors(adamw),
                             adamw_state_metadata(adamw));
    writer.write_text(tmp + "/" + kStateFile, train_state.dump(2) + "\n");
    writer.write_text(tmp + "/" + kConfigFile, config_json);
    checkpoint_io::sync_dir(tmp);
    checkpoint_io::replace_dir(tmp, final_dir);
    checkpoint_io::sync_dir(dir);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  const std::string latest_tmp = dir + "/." + kLatest + kTmpMark + std::to_string(::getpid());
  writer.write_text(latest_tmp, name + "\n");
  checkpoint_io::replace_file(latest_tmp, dir + "/" + kLatest);
  checkpoint_io::sync_dir(dir);
  apply_keep_last(dir, step, options.keep_last);
}

Checkpoint load_checkpoint(const std::string& dir_or_step_dir) {
  std::string path = dir_or_step_dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  MMSP_CHECK(fs::is_directory(path), path, ": no such checkpoint directory");
  std::string step_dir = path;
  const std::string latest = path + "/" + kLatest;
  if (fs::is_directory(latest)) {
    step_dir = fs::canonical(latest).string();  // a symbolic link to the step dir (made by hand)
  } else if (fs::exists(latest)) {
    std::string name = read_text(latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    MMSP_CHECK(parse_step_dir_name(name).has_value(), latest, ": holds \"", name,
               "\"; expected a step dir name such as step-000042");
    step_dir = path + "/" + name;
    MMSP_CHECK(fs::is_directory(step_dir), latest, ": names ", name,
               ", which is not a directory there");
  } else {
    MMSP_CHECK(fs::exists(path + "/" + kStateFile), path,
               ": not a checkpoint: neither a checkpoint directory (no 'latest' file) nor a "
               "step directory (no state.json)");
  }

  Checkpoint c;
  c.path = step_dir;
  const std::string state_path = step_dir + "/" + kStateFile;
  c.state = check_train_state(parse_json(read_text(state_path), state_path), state_path);
  c.step = c.state.at("step").get<int64_t>();
  const auto named_step = parse_step_dir_name(fs::path(step_dir).filename().string());
  MMSP_CHECK(!named_step || *named_step == c.step, state_path, ": step ", c.step,
             " does not match the directory name");
  const std::string config_path = step_dir + "/" + kConfigFile;
  c.config_json = read_text(config_path);
  MMSP_CHECK(parse_json(c.config_json, config_path).is_object(), config_path,
             ": must be a JSON object");
  const std::string model_path = step_dir + "/" + kModelFile;
  MMSP_CHECK(fs::is_regular_file(model_path), model_path, ": missing (an incomplete checkpoint?)");
  c.model = model::load_safetensors(model_path);
  const std::string optimizer_path = step_dir + "/" + kOptimizerFile;
  MMSP_CHECK(fs::is_regular_file(optimizer_path), optimizer_path,
             ": missing (an incomplete checkpoint?)");
  c.optimizer = adamw_state_from(model::load_safetensors(optimizer_path),
                                 model::read_safetensors_header(optimizer_path).metadata,
                                 optimizer_path);
  for (const auto& [name, moments] : c.optimizer.params) {
    auto it = c.model.find(name);
    MMSP_CHECK(it != c.model.end(), optimizer_path, ": has state for ", name,
               ", which is not in ", kModelFile);
    MMSP_CHECK(it->second.sizes() == moments.exp_avg.sizes(), optimizer_path, ": ", name,
               ".exp_avg has shape ", moments.exp_avg.sizes(), " but the weight has ",
               it->second.sizes());
  }
  return c;
}

void restore(const Checkpoint& c, torch::nn::Module& model, torch::optim::AdamW& optimizer) {
  const std::string model_path = c.path + "/" + kModelFile;
  auto params = model.named_parameters();
  std::vector<std::string> missing, unexpected, shapes;
  for (const auto& item : params) {
    auto it = c.model.find(item.key());
    if (it == c.model.end()) {
      missing.push_back(item.key());
    } else if (it->second.sizes() != item.value().sizes()) {
      shapes.push_back(detail::concat(item.key(), " is ", it->second.sizes(), " in the file but ",
                                      item.value().sizes(), " in the model"));
    }
  }
  for (const auto& [name, tensor] : c.model)
    if (!params.contains(name)) unexpected.push_back(name);
  MMSP_CHECK(missing.empty(), model_path, ": the model's parameters ", names_list(missing),
             " are not in the checkpoint");
  MMSP_CHECK(unexpected.empty(), model_path, ": the checkpoint's tensors ", names_list(unexpected),
             " are not parameters of the model (another model or config?)");
  MMSP_CHECK(shapes.empty(), model_path, ": shapes differ: ", names_list(shapes));
  // The RNG state is checked by setting it; apply_adamw_state checks everything
  // before it changes the optimizer, and on its refusal the RNG goes back.
  const std::string before = capture_cpu_rng();
  restore_cpu_rng(c.state.at("cpu_rng").get<std::string>(), c.path + "/" + kStateFile);
  try {
    apply_adamw_state(c.optimizer, optimizer, model, c.path + "/" + kOptimizerFile);
  } catch (...) {
    restore_cpu_rng(before, "the generator state before restore");
    throw;
  }
  at::NoGradGuard no_grad;
  for (auto& item : params) item.value().copy_(c.model.at(item.key()));
}

}  // namespace mmsp::train
