// Atomic checkpoints; see checkpoint.h. The files are written by checkpoint_io.
#include "mmsp/train/checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "checkpoint/checkpoint_io.h"
#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#include "mmsp/hf/checksum_manifest.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/hf/safetensors.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kHfDir = "hf";                           // the weights, HF layout, save dtype
constexpr const char* kMasterDir = "master";                   // the training weights' own dtype, when it differs
constexpr const char* kLegacyModelFile = "model.safetensors";  // first format
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
  MMSP_CHECK(fs::is_regular_file(path), path, ": missing (an incomplete checkpoint, or not a checkpoint directory)");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  MMSP_CHECK(in.good() || in.eof(), path, ": cannot read");
  return text.str();
}

json parse_json(const std::string& text, const std::string& path) { return parse_json_text(text, path); }

// Leftovers of crashed saves: hidden names carrying the temporary mark (but `spare`:
// the shards the ranks of this save have just staged).
void remove_leftovers(const std::string& dir, const std::string& spare = "") {
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name[0] == '.' && name.find(kTmpMark) != std::string::npos && entry.path().string() != spare)
      fs::remove_all(entry.path());
  }
}

// A step dir a resume could load: state.json parses, passes check_train_state and
// names the dir's step, the optimizer file is there and not empty, and the weights
// open (hf/'s headers and index check out; the first format: its files are there).
// (Reading every tensor is load_checkpoint's job; this is the cheap test that --keep
// relies on.)
bool looks_complete(const fs::path& step_dir, int64_t step) {
  auto non_empty = [&](const fs::path& file) {
    std::error_code ec;
    return fs::is_regular_file(file, ec) && fs::file_size(file, ec) > 0 && !ec;
  };
  try {
    const fs::path shards = step_dir / kOptimizerShardDir;
    if (!non_empty(step_dir / kOptimizerFile) && !(fs::is_directory(shards) && !fs::is_empty(shards))) return false;
    if (fs::is_directory(step_dir / kHfDir)) {
      hf::open_hf_directory((step_dir / kHfDir).string());
      if (fs::exists(step_dir / kMasterDir)) hf::open_hf_directory((step_dir / kMasterDir).string());
    } else if (!non_empty(step_dir / kLegacyModelFile) || !non_empty(step_dir / kConfigFile)) {
      return false;
    }
    const std::string state_path = (step_dir / kStateFile).string();
    const json state = check_train_state(parse_json(read_text(state_path), state_path), state_path);
    return state.at("step").get<int64_t>() == step;
  } catch (const std::exception&) { return false; }
}

// Keeps the newest `keep_last` complete step dirs up to `step` and deletes the older
// ones, complete or not. Incomplete dirs newer than the oldest kept one are left for
// inspection, and never count: a corrupt newer dir cannot push out the last good one.
// Step dirs after `step` are left alone (a run that went further before a resume).
void apply_keep_last(const std::string& dir, int64_t step, int keep_last, bool crash_after_rename) {
  if (keep_last <= 0) return;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto s = parse_step_dir_name(entry.path().filename().string());
    if (s && *s <= step && entry.is_directory()) steps.emplace_back(*s, entry.path());
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  int kept = 0;
  for (const auto& [s, path] : steps) {
    if (kept >= keep_last) {
      // Renamed first, deleted after: a crash in between leaves a hidden temporary
      // (removed with the next save's leftovers), never a half-deleted step dir.
      const fs::path doomed = path.parent_path() / ("." + path.filename().string() + kTmpMark + "deleting");
      fs::rename(path, doomed);
      if (crash_after_rename) std::_Exit(kCheckpointCrashExitCode);
      fs::remove_all(doomed);
    } else if (looks_complete(path, s)) {
      ++kept;
    }
  }
  checkpoint_io::sync_dir(dir);
}

model::NamedParams named(const torch::nn::Module& model) {
  model::NamedParams out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// Does hf/ in `save_dtype` hold every weight exactly? Else master/ is written too.
bool needs_master_copy(const model::NamedParams& weights, const std::optional<at::ScalarType>& save_dtype) {
  if (!save_dtype) return false;
  for (const auto& [name, w] : weights)
    if (at::isFloatingType(w.scalar_type()) && w.scalar_type() != *save_dtype) return true;
  return false;
}

json without_dtype(json config) {
  if (config.is_object()) config.erase("torch_dtype");
  return config;
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
                     const torch::optim::AdamW& optimizer, const json& state, const std::string& config_json,
                     const CheckpointOptions& options) {
  save_checkpoint(dir, step, named(model), optimizer, state, config_json, options);
}

bool same_model_config(const std::string& a, const std::string& b) {
  if (a == b) return true;
  try {
    return without_dtype(json::parse(a)) == without_dtype(json::parse(b));
  } catch (const json::exception&) { return false; }
}

namespace {

void save_step(const std::string& dir, int64_t step, const model::NamedParams& weights, const AdamWState* adamw,
               const json& state, const std::string& config_json, const CheckpointOptions& options) {
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
  model::check_named_params(weights, "save_checkpoint");

  fs::create_directories(dir);
  remove_leftovers(dir, options.optimizer_shards_staged);
  const std::string tmp = dir + "/." + name + kTmpMark + std::to_string(::getpid());
  const std::string final_dir = dir + "/" + name;
  MMSP_CHECK(fs::create_directory(tmp), tmp, ": cannot create the temporary checkpoint dir");
  checkpoint_io::DurableWriter writer(options.crash_after_bytes, kCheckpointCrashExitCode);
  try {
    hf::HfSaveOptions hf;
    hf.max_shard_bytes = options.max_shard_bytes;
    hf.progress = [&writer](uint64_t bytes) { writer.count(static_cast<int64_t>(bytes)); };
    std::vector<std::pair<std::string, at::Tensor>> tensors, hf_tensors;
    for (const auto& [name, w] : weights) tensors.emplace_back(name, w.detach());
    for (const auto& [name, w] : options.hf_weights ? *options.hf_weights : weights)
      hf_tensors.emplace_back(name, w.detach());
    hf.dtype = options.save_dtype;
    hf::save_hf_directory(tmp + "/" + kHfDir, hf_tensors, config_json, hf);
    if (options.hf_weights || (adamw && needs_master_copy(weights, options.save_dtype))) {
      hf.dtype.reset();
      hf::save_hf_directory(tmp + "/" + kMasterDir, tensors, config_json, hf);
    }
    hf::ChecksumManifest manifest;
    if (options.extra)
      for (const auto& [file, sum] : options.extra(tmp)) manifest[file] = sum;
    if (adamw) {
      writer.write_safetensors(tmp + "/" + kOptimizerFile, adamw_state_tensors(*adamw), adamw_state_metadata(*adamw));
      manifest[kOptimizerFile] = writer.checksums().at(tmp + "/" + kOptimizerFile);
    } else {
      fs::rename(options.optimizer_shards_staged, tmp + "/" + kOptimizerShardDir);
      checkpoint_io::sync_dir(tmp + "/" + kOptimizerShardDir);
      for (const auto& [file, sum] : options.optimizer_shard_checksums)
        manifest[std::string(kOptimizerShardDir) + "/" + file] = sum;
    }
    writer.write_text(tmp + "/" + kStateFile, train_state.dump(2) + "\n");
    // Last: checksums.json over the step dir's own files and the manifests of hf/ and
    // master/ (which cover their files), so every byte of the checkpoint is covered.
    manifest[kStateFile] = writer.checksums().at(tmp + "/" + kStateFile);
    for (const char* sub : {kHfDir, kMasterDir}) {
      const std::string inner = std::string(sub) + "/" + hf::kChecksumFile;
      if (fs::exists(tmp + "/" + inner)) manifest[inner] = hf::checksum_of_file(tmp + "/" + inner);
    }
    writer.write_text(tmp + "/" + hf::kChecksumFile, hf::checksum_manifest_json(manifest));
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
  apply_keep_last(dir, step, options.keep_last, options.crash_in_keep);
}

}  // namespace

std::string shard_staging_dir(const std::string& dir, int64_t step) {
  return dir + "/." + step_dir_name(step) + kTmpMark + "shards";
}

void save_checkpoint(const std::string& dir, int64_t step, const model::NamedParams& weights,
                     const torch::optim::AdamW& optimizer, const json& state, const std::string& config_json,
                     const CheckpointOptions& options) {
  MMSP_CHECK(options.optimizer_shards_staged.empty(),
             "save_checkpoint: an AdamW optimizer and staged optimizer shards are given; use one");
  model::check_named_params(weights, "save_checkpoint");
  const AdamWState adamw = capture_adamw_state(optimizer, weights);
  save_step(dir, step, weights, &adamw, state, config_json, options);
}

void save_checkpoint(const std::string& dir, int64_t step, const model::NamedParams& weights, const AdamWState& adamw,
                     const json& state, const std::string& config_json, const CheckpointOptions& options) {
  MMSP_CHECK(options.optimizer_shards_staged.empty(),
             "save_checkpoint: an AdamW state and staged optimizer shards are given; use one");
  model::check_named_params(weights, "save_checkpoint");
  save_step(dir, step, weights, &adamw, state, config_json, options);
}

void save_checkpoint(const std::string& dir, int64_t step, const model::NamedParams& weights, const json& state,
                     const std::string& config_json, const CheckpointOptions& options) {
  MMSP_CHECK(options.optimizer_shards_staged == shard_staging_dir(dir, step),
             "save_checkpoint: staged optimizer shards must be in ", shard_staging_dir(dir, step), ", not \"",
             options.optimizer_shards_staged, "\"");
  save_step(dir, step, weights, nullptr, state, config_json, options);
}

namespace {

// The step directory a path names: a checkpoint directory's `latest` (a file naming the
// step dir, or a link to it made by hand), or a step directory itself.
std::string resolve_step_dir(const std::string& dir_or_step_dir) {
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
    MMSP_CHECK(fs::is_directory(step_dir), latest, ": names ", name, ", which is not a directory there");
  } else {
    MMSP_CHECK(fs::exists(path + "/" + kStateFile), path,
               ": not a checkpoint: neither a checkpoint directory (no 'latest' file) nor a "
               "step directory (no state.json)");
  }
  return step_dir;
}

}  // namespace

Checkpoint load_checkpoint(const std::string& dir_or_step_dir) {
  const std::string step_dir = resolve_step_dir(dir_or_step_dir);
  Checkpoint c;
  c.path = step_dir;
  // Every file is verified before any is parsed (hf/ and master/ by hf::open_hf_directory).
  const hf::ManifestVerdict manifest = hf::verify_checksum_manifest(step_dir);
  if (manifest.check == hf::ManifestCheck::absent)
    c.notes.push_back(step_dir + " has no " + hf::kChecksumFile +
                      " (a checkpoint of an older mmsp, before format version 1): its files are not verified");
  c.manifest_xxh64 = manifest.manifest_xxh64;
  const std::string state_path = step_dir + "/" + kStateFile;
  hf::check_listed(manifest, step_dir, kStateFile);
  c.state = check_train_state(parse_json(read_text(state_path), state_path), state_path);
  c.step = c.state.at("step").get<int64_t>();
  const auto named_step = parse_step_dir_name(fs::path(step_dir).filename().string());
  MMSP_CHECK(!named_step || *named_step == c.step, state_path, ": step ", c.step, " does not match the directory name");
  // Weight names and shapes, for the optimizer state's check below.
  std::map<std::string, std::vector<int64_t>> shapes;
  const std::string hf_dir = step_dir + "/" + kHfDir;
  if (fs::is_directory(hf_dir)) {
    const std::string master_dir = step_dir + "/" + kMasterDir;
    const hf::HfDirectory hf = hf::open_hf_directory(hf_dir);
    c.config_json = hf.config_json;
    c.weights = fs::is_directory(master_dir) ? hf::open_hf_directory(master_dir) : hf;
    for (const auto& [name, t] : c.weights.tensors) shapes[name] = t.entry.shape;
  } else {
    // The first format: model.safetensors and config.json beside state.json.
    MMSP_CHECK(fs::is_regular_file(step_dir + "/" + kLegacyModelFile), hf_dir, ": missing (an incomplete checkpoint?)");
    const std::string config_path = step_dir + "/" + kConfigFile;
    c.config_json = read_text(config_path);
    MMSP_CHECK(parse_json(c.config_json, config_path).is_object(), config_path, ": must be a JSON object");
    c.legacy_model = hf::load_safetensors(step_dir + "/" + kLegacyModelFile);
    for (const auto& [name, t] : c.legacy_model) shapes[name] = t.sizes().vec();
  }
  const std::string shard_dir = step_dir + "/" + kOptimizerShardDir;
  if (fs::is_directory(shard_dir)) {  // a --shard optimizer run's: one file per rank
    for (const auto& entry : fs::directory_iterator(shard_dir))
      hf::check_listed(manifest, step_dir, std::string(kOptimizerShardDir) + "/" + entry.path().filename().string());
    c.optimizer_shards = open_optimizer_shards(shard_dir, shapes);
    MMSP_CHECK(c.optimizer_shards->steps == c.step, shard_dir, ": the optimizer took ", c.optimizer_shards->steps,
               " steps but the checkpoint is of step ", c.step);
    return c;
  }
  const std::string optimizer_path = step_dir + "/" + kOptimizerFile;
  MMSP_CHECK(fs::is_regular_file(optimizer_path), optimizer_path, ": missing (an incomplete checkpoint?)");
  hf::check_listed(manifest, step_dir, kOptimizerFile);
  c.optimizer = adamw_state_from(hf::load_safetensors(optimizer_path),
                                 hf::read_safetensors_header(optimizer_path).metadata, optimizer_path);
  for (const auto& [name, moments] : c.optimizer.params) {
    auto it = shapes.find(name);
    MMSP_CHECK(it != shapes.end(), optimizer_path, ": has state for ", name,
               ", which is not among the checkpoint's weights");
    MMSP_CHECK(it->second == moments.exp_avg.sizes().vec(), optimizer_path, ": ", name, ".exp_avg has shape ",
               moments.exp_avg.sizes(), " but the weight has ", at::IntArrayRef(it->second));
  }
  return c;
}

namespace {

// The weights no optimizer steps (--freeze), from the checkpoint's own names: whole tensors
// of hf/ (or master/), converted to each weight's dtype.
void restore_frozen(const Checkpoint& c, const model::NamedParams& frozen) {
  at::NoGradGuard no_grad;
  for (const auto& [name, w] : frozen)
    w.detach().copy_(hf::read_hf_elements(c.weights, name, 0, w.numel()).view(w.sizes()));
}

}  // namespace

void restore(const Checkpoint& c, torch::nn::Module& model, torch::optim::AdamW& optimizer) {
  restore(c, named(model), optimizer);
}

void restore(const Checkpoint& c, const model::NamedParams& weights, torch::optim::AdamW& optimizer) {
  const bool legacy = c.weights.tensors.empty() && !c.legacy_model.empty();
  const std::string model_path = legacy ? c.path + "/" + kLegacyModelFile : c.weights.path;
  // The checkpoint holds our own names: no aliases, nothing tied away.
  const hf::CheckpointNaming exact;
  if (legacy) {
    std::vector<std::string> missing, unexpected, shapes;
    std::set<std::string> ours;
    for (const auto& [name, w] : weights) {
      ours.insert(name);
      auto it = c.legacy_model.find(name);
      if (it == c.legacy_model.end())
        missing.push_back(name);
      else if (it->second.sizes() != w.sizes())
        shapes.push_back(
            detail::concat(name, " is ", it->second.sizes(), " in the file but ", w.sizes(), " in the model"));
    }
    for (const auto& [name, tensor] : c.legacy_model)
      if (!ours.count(name)) unexpected.push_back(name);
    MMSP_CHECK(missing.empty(), model_path, ": the model's parameters ", names_list(missing),
               " are not in the checkpoint");
    MMSP_CHECK(unexpected.empty(), model_path, ": the checkpoint's tensors ", names_list(unexpected),
               " are not parameters of the model (another model or config?)");
    MMSP_CHECK(shapes.empty(), model_path, ": shapes differ: ", names_list(shapes));
  } else {
    hf::ExpectedShapes expected;
    for (const auto& [name, w] : weights) expected.emplace_back(name, w.sizes().vec());
    hf::match_hf_tensors(c.weights, expected, exact);  // throws, naming every difference
  }
  // The RNG state is checked by setting it; apply_adamw_state checks everything
  // before it changes the optimizer, and on its refusal the RNG goes back.
  const std::string before = capture_cpu_rng();
  restore_cpu_rng(c.state.at("cpu_rng").get<std::string>(), c.path + "/" + kStateFile);
  // A frozen weight (--freeze) is in the checkpoint's weights but not in the optimizer.
  model::NamedParams stepped, frozen;
  {
    std::set<const void*> in_optimizer;
    for (const auto& group : optimizer.param_groups())
      for (const at::Tensor& p : group.params()) in_optimizer.insert(p.unsafeGetTensorImpl());
    for (const auto& named : weights)
      (in_optimizer.count(named.second.unsafeGetTensorImpl()) ? stepped : frozen).push_back(named);
  }
  try {
    if (c.optimizer_shards) {
      AdamWState state = capture_adamw_state(optimizer, weights);  // the groups as this run built them
      state.params = gather_adamw_moments(*c.optimizer_shards, stepped);
      apply_adamw_state(state, optimizer, weights, c.optimizer_shards->dir);
    } else {
      apply_adamw_state(c.optimizer, optimizer, weights, c.path + "/" + kOptimizerFile);
    }
  } catch (...) {
    restore_cpu_rng(before, "the generator state before restore");
    throw;
  }
  if (legacy) {
    at::NoGradGuard no_grad;
    for (const auto& [name, w] : weights) w.detach().copy_(c.legacy_model.at(name));
    return;
  }
  if (c.optimizer_shards) {  // the exact masters are in the shards, hf/ may be rounded
    at::NoGradGuard no_grad;
    for (const auto& [name, w] : stepped)
      w.detach().copy_(
          read_optimizer_shards(*c.optimizer_shards, name, ShardTensor::master, 0, w.numel()).view(w.sizes()));
    restore_frozen(c, frozen);
    return;
  }
  hf::load_hf_weights(c.weights, weights, exact);
}

void restore(const Checkpoint& c, ShardedAdamW& optimizer, const model::NamedParams& frozen) {
  restore(c, {&optimizer}, frozen, hf::CheckpointNaming{});
}

void restore(const Checkpoint& c, const std::vector<ShardedAdamW*>& optimizers, const model::NamedParams& frozen,
             const hf::CheckpointNaming& naming) {
  MMSP_CHECK(!c.weights.tensors.empty(), c.path,
             ": a checkpoint of the first format cannot be resumed with "
             "a sharded --shard level; resume it with --shard none once and save again");
  hf::ExpectedShapes expected;
  for (const ShardedAdamW* optimizer : optimizers)
    for (const auto& [name, w] : optimizer->model_params()) expected.emplace_back(name, w.sizes().vec());
  for (const auto& [name, w] : frozen) expected.emplace_back(name, w.sizes().vec());
  hf::match_hf_tensors(c.weights, expected, naming);  // throws, naming every difference
  ShardedAdamW::StateReader read;
  int64_t steps = 0;
  if (c.optimizer_shards) {
    steps = c.optimizer_shards->steps;
    read = [&](const std::string& name, ShardTensor which, int64_t offset, int64_t length) {
      return read_optimizer_shards(*c.optimizer_shards, name, which, offset, length);
    };
  } else {
    for (const auto& [name, m] : c.optimizer.params) steps = std::max(steps, m.step);
    for (const auto& [name, m] : c.optimizer.params)
      MMSP_CHECK(m.step == steps, c.path, "/", kOptimizerFile, ": ", name, " took ", m.step, " steps and another ",
                 steps, "; a sharded optimizer steps every parameter alike");
    read = [&](const std::string& name, ShardTensor which, int64_t offset, int64_t length) -> at::Tensor {
      if (which == ShardTensor::master) return hf::read_hf_elements(c.weights, name, offset, length);
      auto it = c.optimizer.params.find(name);
      if (it == c.optimizer.params.end()) return at::zeros({length}, at::kDouble);  // never stepped
      const at::Tensor& t = which == ShardTensor::exp_avg ? it->second.exp_avg : it->second.exp_avg_sq;
      return t.reshape({-1}).narrow(0, offset, length);
    };
  }
  const std::string before = capture_cpu_rng();
  restore_cpu_rng(c.state.at("cpu_rng").get<std::string>(), c.path + "/" + kStateFile);
  try {
    for (ShardedAdamW* optimizer : optimizers) optimizer->load(steps, read);
  } catch (...) {
    restore_cpu_rng(before, "the generator state before restore");
    throw;
  }
  restore_frozen(c, frozen);
}

}  // namespace mmsp::train
