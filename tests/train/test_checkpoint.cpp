// Checkpoints: bitwise resume, the `latest` pointer and keep_last, a crash in the
// middle of a save (a forked child killed by the crash_after_bytes hook), and
// clear errors for missing, corrupted or mismatched files.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../support/json_mutants.h"
#include "error_of.h"
#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#include "mmsp/core/xxhash64.h"
#include "mmsp/hf/checksum_manifest.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/hf/safetensors.h"
#include "mmsp/train/checkpoint/checkpoint.h"
#include "mmsp/train/checkpoint/run_directory.h"
#include "mmsp/train/optim/optimizer.h"
#include "mmsp/train/run_checks.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

const char* const kConfig = "{\"model_type\": \"tiny\", \"hidden_size\": 4}\n";

struct Affine : torch::nn::Module {
  Affine(int64_t in, int64_t out, at::ScalarType dtype) {
    weight = register_parameter("weight", (at::randn({out, in}, at::kDouble) * 0.5).to(dtype));
    bias = register_parameter("bias", (at::randn({out}, at::kDouble) * 0.1).to(dtype));
  }
  at::Tensor weight, bias;
};

// proj (fp64) -> tanh -> head (fp32) -> · norm; "unused" never gets a gradient.
struct Tiny : torch::nn::Module {
  explicit Tiny(int64_t hidden = 4) {
    proj = register_module("proj", std::make_shared<Affine>(3, hidden, at::kDouble));
    head = register_module("head", std::make_shared<Affine>(hidden, 2, at::kFloat));
    norm = register_parameter("norm", at::ones({2}, at::kFloat));
    unused = register_parameter("unused", at::zeros({2, 2}, at::kFloat));
  }
  std::shared_ptr<Affine> proj, head;
  at::Tensor norm, unused;
};

model::NamedParams named(const torch::nn::Module& m) {
  model::NamedParams out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// One optimiser step on a batch drawn from the default CPU generator (so a resume
// is only bitwise equal if the RNG state comes back too).
void train_step(Tiny& m, torch::optim::AdamW& opt, double lr) {
  set_lr(opt, lr);
  opt.zero_grad();
  at::Tensor x = at::rand({5, 3}, at::kDouble);
  at::Tensor y = at::tanh(at::addmm(m.proj->bias, x, m.proj->weight.t()));
  at::Tensor z = at::addmm(m.head->bias, y.to(at::kFloat), m.head->weight.t()) * m.norm;
  (z - 0.5).pow(2).sum().backward();
  opt.step();
}

struct Trained {
  std::shared_ptr<Tiny> model;
  std::unique_ptr<torch::optim::AdamW> opt;
};

Trained trained(int steps, uint64_t seed = 1) {
  at::manual_seed(seed);
  Trained t;
  t.model = std::make_shared<Tiny>();
  t.opt = make_adamw(named(*t.model), {1e-2, 0.9, 0.99, 1e-8, 0.1});
  for (int s = 0; s < steps; ++s) train_step(*t.model, *t.opt, 1e-2 / (s + 1));
  return t;
}

json state_json(int64_t epoch, int64_t offset) {
  return {{"data", {{"epoch", epoch}, {"offset", offset}}}, {"run", {{"mesh", "dp1 x ring1"}}}};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

using test::error_of;

void expect_same_training_state(Tiny& a, torch::optim::AdamW& oa, Tiny& b, torch::optim::AdamW& ob) {
  for (const auto& [name, p] : named(a)) {
    const at::Tensor q = b.named_parameters()[name];
    EXPECT_EQ(p.scalar_type(), q.scalar_type()) << name;
    EXPECT_TRUE(at::equal(p, q)) << name << " differs";
  }
  const AdamWState sa = capture_adamw_state(oa, a), sb = capture_adamw_state(ob, b);
  ASSERT_EQ(sa.params.size(), sb.params.size());
  for (const auto& [name, m] : sa.params) {
    const AdamWParamMoments& n = sb.params.at(name);
    EXPECT_EQ(m.step, n.step) << name;
    EXPECT_TRUE(at::equal(m.exp_avg, n.exp_avg)) << name;
    EXPECT_TRUE(at::equal(m.exp_avg_sq, n.exp_avg_sq)) << name;
  }
  ASSERT_EQ(sa.groups.size(), sb.groups.size());
  for (size_t g = 0; g < sa.groups.size(); ++g) {
    EXPECT_EQ(sa.groups[g].params, sb.groups[g].params);
    EXPECT_EQ(sa.groups[g].betas, sb.groups[g].betas);
    EXPECT_EQ(sa.groups[g].eps, sb.groups[g].eps);
    EXPECT_EQ(sa.groups[g].weight_decay, sb.groups[g].weight_decay);
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/mmsp-checkpoint-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(CheckpointTest, ResumeIsBitwiseIdenticalToNeverStopping) {
  Trained a = trained(3);
  save_checkpoint(dir_, 3, *a.model, *a.opt, state_json(1, 17), kConfig);
  for (int s = 3; s < 5; ++s) train_step(*a.model, *a.opt, 1e-2 / (s + 1));  // never stopped

  at::manual_seed(99);  // a fresh model and optimizer with other values and options
  auto b = std::make_shared<Tiny>();
  auto ob = make_adamw(named(*b), {5.0, 0.5, 0.6, 1e-3, 0.0});
  const Checkpoint c = load_checkpoint(dir_);
  EXPECT_EQ(c.path, dir_ + "/step-000003");
  EXPECT_EQ(c.step, 3);
  EXPECT_EQ(c.state.at("data"), json({{"epoch", 1}, {"offset", 17}}));
  EXPECT_EQ(c.state.at("run").at("mesh"), "dp1 x ring1");
  EXPECT_TRUE(same_model_config(c.config_json, kConfig));
  EXPECT_EQ(c.weights.path, c.path + "/hf");  // every weight saved in its own dtype: no master/
  EXPECT_EQ(c.weights.tensors.size(), 6u);
  EXPECT_EQ(c.optimizer.params.count("unused"), 0u);  // never stepped: no state
  EXPECT_EQ(c.optimizer.params.at("proj.weight").step, 3);
  restore(c, *b, *ob);
  const auto& restored = static_cast<const torch::optim::AdamWOptions&>(ob->param_groups()[0].options());
  EXPECT_EQ(restored.weight_decay(), 0.1);
  EXPECT_EQ(std::get<1>(restored.betas()), 0.99);
  EXPECT_EQ(restored.lr(), 1e-2 / 3);  // the lr of the last step before the save
  for (int s = 3; s < 5; ++s) train_step(*b, *ob, 1e-2 / (s + 1));
  expect_same_training_state(*a.model, *a.opt, *b, *ob);
}

TEST_F(CheckpointTest, FilesHoldNamedTensorsInTheSafetensorsLayout) {
  Trained a = trained(2);
  save_checkpoint(dir_, 2, *a.model, *a.opt, state_json(0, 4), kConfig);
  const std::string step = dir_ + "/step-000002";
  // hf/model.safetensors: what hf::serialize_safetensors writes for the parameters
  // (one shard: they are small), each in its own dtype.
  std::map<std::string, at::Tensor> params;
  for (const auto& [name, p] : named(*a.model)) params[name] = p.detach();
  EXPECT_EQ(read_file(step + "/hf/model.safetensors"), hf::serialize_safetensors(params, {{"format", "pt"}}));
  EXPECT_FALSE(fs::exists(step + "/master"));
  // optimizer.safetensors: moments by parameter name, step counts in the metadata.
  const AdamWState s = capture_adamw_state(*a.opt, *a.model);
  EXPECT_EQ(read_file(step + "/optimizer.safetensors"),
            hf::serialize_safetensors(adamw_state_tensors(s), adamw_state_metadata(s)));
  const auto header = hf::read_safetensors_header(step + "/optimizer.safetensors");
  EXPECT_EQ(header.tensors.count("head.bias.exp_avg_sq"), 1u);
  EXPECT_EQ(header.tensors.at("proj.weight.exp_avg").dtype, "F64");
  const json meta = json::parse(header.metadata.at("mmsp.adamw"));
  EXPECT_EQ(meta.at("steps").at("norm"), 2);
  std::vector<std::string> matrices;
  for (const auto& [name, p] : named(*a.model))
    if (p.dim() >= 2) matrices.push_back(name);
  EXPECT_EQ(matrices.size(), 3u);
  EXPECT_EQ(meta.at("groups").at(0).at("params"), json(matrices));
  const json state = json::parse(read_file(step + "/state.json"));
  EXPECT_EQ(state.at("step"), 2);
  EXPECT_EQ(state.at("version"), 1);
  // hf/config.json: the config with the saved dtype (the one holding the most bytes).
  json config = json::parse(read_file(step + "/hf/config.json"));
  EXPECT_EQ(config.at("torch_dtype"), "float64");
  config.erase("torch_dtype");
  EXPECT_EQ(config, json::parse(kConfig));
  EXPECT_EQ(read_file(dir_ + "/latest"), "step-000002\n");
}

TEST_F(CheckpointTest, AnotherSaveDtypeKeepsExactMastersBeside) {
  Trained a = trained(2);
  CheckpointOptions bf16;
  bf16.save_dtype = at::kBFloat16;
  bf16.max_shard_bytes = 16;  // a few tensors per shard
  save_checkpoint(dir_, 2, *a.model, *a.opt, state_json(0, 2), kConfig, bf16);
  const std::string step = dir_ + "/step-000002";
  const hf::HfDirectory hf = hf::open_hf_directory(step + "/hf");
  EXPECT_TRUE(hf.indexed);
  EXPECT_GT(hf.files.size(), 1u);
  for (const auto& [name, t] : hf.tensors) EXPECT_EQ(t.entry.scalar_type, at::kBFloat16) << name;
  EXPECT_EQ(json::parse(hf.config_json).at("torch_dtype"), "bfloat16");
  // master/ holds the weights exactly; the resume reads them from there.
  const Checkpoint c = load_checkpoint(dir_);
  EXPECT_EQ(c.weights.path, step + "/master");
  at::manual_seed(8);
  auto b = std::make_shared<Tiny>();
  auto ob = make_adamw(named(*b), {});
  restore(c, *b, *ob);
  expect_same_training_state(*a.model, *a.opt, *b, *ob);
}

TEST_F(CheckpointTest, RestoresTheCpuGenerator) {
  Trained a = trained(1);
  save_checkpoint(dir_, 1, *a.model, *a.opt, state_json(0, 0), kConfig);
  const at::Tensor next = at::rand({4}, at::kDouble);
  at::manual_seed(12345);
  restore(load_checkpoint(dir_), *a.model, *a.opt);
  EXPECT_TRUE(at::equal(at::rand({4}, at::kDouble), next));
}

TEST_F(CheckpointTest, AmsgradStateRoundTrips) {
  at::manual_seed(3);
  Tiny a, b;
  auto options = torch::optim::AdamWOptions(1e-2).amsgrad(true);
  torch::optim::AdamW oa(a.parameters(), options), ob(b.parameters(), torch::optim::AdamWOptions(1.0));
  train_step(a, oa, 1e-2);
  const AdamWState s = capture_adamw_state(oa, a);
  const auto tensors = adamw_state_tensors(s);
  EXPECT_EQ(tensors.count("proj.bias.max_exp_avg_sq"), 1u);
  const AdamWState back = adamw_state_from(tensors, adamw_state_metadata(s), "test");
  for (auto& item : b.named_parameters()) {
    at::NoGradGuard no_grad;
    item.value().copy_(a.named_parameters()[item.key()]);
  }
  apply_adamw_state(back, ob, b, "test");
  at::manual_seed(5);
  train_step(a, oa, 1e-2);
  at::manual_seed(5);
  train_step(b, ob, 1e-2);
  expect_same_training_state(a, oa, b, ob);
  EXPECT_TRUE(at::equal(capture_adamw_state(ob, b).params.at("norm").max_exp_avg_sq,
                        capture_adamw_state(oa, a).params.at("norm").max_exp_avg_sq));
}

TEST_F(CheckpointTest, LatestPointerAndKeepLast) {
  Trained a = trained(1);
  CheckpointOptions keep2;
  keep2.keep_last = 2;
  for (int64_t step = 1; step <= 5; ++step)
    save_checkpoint(dir_, step, *a.model, *a.opt, state_json(0, step), kConfig, keep2);
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir_)) entries.push_back(e.path().filename().string());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"latest", "step-000004", "step-000005"}));
  EXPECT_EQ(read_file(dir_ + "/latest"), "step-000005\n");
  EXPECT_EQ(load_checkpoint(dir_).step, 5);
  EXPECT_EQ(load_checkpoint(dir_ + "/step-000004/").step, 4);  // a step dir directly
  EXPECT_EQ(load_checkpoint(dir_ + "/step-000004").state.at("data").at("offset"), 4);

  // Saving a step again (after a resume) replaces it.
  save_checkpoint(dir_, 5, *a.model, *a.opt, state_json(7, 70), kConfig, keep2);
  EXPECT_EQ(load_checkpoint(dir_).state.at("data").at("epoch"), 7);
  // An older step saved later (resumed from further back) becomes latest; later step
  // dirs are left alone; keep_last counts up to the saved step.
  save_checkpoint(dir_, 3, *a.model, *a.opt, state_json(0, 3), kConfig, keep2);
  EXPECT_EQ(read_file(dir_ + "/latest"), "step-000003\n");
  EXPECT_TRUE(fs::exists(dir_ + "/step-000005"));
  EXPECT_EQ(step_dir_name(1234567), "step-1234567");
}

// --keep counts only complete step dirs: corrupt newer ones never push out the last good one.
TEST_F(CheckpointTest, KeepNeverDeletesTheNewestCompleteCheckpoint) {
  Trained a = trained(1);
  CheckpointOptions keep2;
  keep2.keep_last = 2;
  for (int64_t step = 1; step <= 2; ++step)
    save_checkpoint(dir_, step, *a.model, *a.opt, state_json(0, step), kConfig, keep2);
  // step 3: truncated state.json; step 4: a copy of step 2 (wrong step) without its weights.
  fs::copy(dir_ + "/step-000002", dir_ + "/step-000003", fs::copy_options::recursive);
  write_file(dir_ + "/step-000003/state.json", "{\"step\": 3, \"data\"");
  fs::copy(dir_ + "/step-000002", dir_ + "/step-000004", fs::copy_options::recursive);
  fs::remove(dir_ + "/step-000004/hf/model.safetensors");
  save_checkpoint(dir_, 5, *a.model, *a.opt, state_json(0, 5), kConfig, keep2);
  EXPECT_TRUE(fs::exists(dir_ + "/step-000005"));
  EXPECT_TRUE(fs::exists(dir_ + "/step-000002")) << "the newest complete checkpoint before 5 was deleted";
  EXPECT_FALSE(fs::exists(dir_ + "/step-000001"));
  EXPECT_TRUE(fs::exists(dir_ + "/step-000003"));  // left for inspection, never counted
  EXPECT_EQ(load_checkpoint(dir_ + "/step-000002").step, 2);
  // The next save keeps 6 and 5; everything older goes, complete or not.
  save_checkpoint(dir_, 6, *a.model, *a.opt, state_json(0, 6), kConfig, keep2);
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir_)) entries.push_back(e.path().filename().string());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"latest", "step-000005", "step-000006"}));
}

// A `latest` that is a symbolic link to a step dir is followed.
TEST_F(CheckpointTest, LatestMayBeASymbolicLinkToTheStepDir) {
  Trained a = trained(1);
  for (int64_t step = 1; step <= 2; ++step)
    save_checkpoint(dir_, step, *a.model, *a.opt, state_json(0, step), kConfig, {});
  fs::remove(dir_ + "/latest");
  fs::create_directory_symlink("step-000001", dir_ + "/latest");
  const Checkpoint c = load_checkpoint(dir_);
  EXPECT_EQ(c.step, 1);
  EXPECT_EQ(fs::path(c.path).filename(), "step-000001");
}

// Resume compares the run's flags with the checkpoint's: batch- or numerics-changing
// ones are named and refused (or noted with allow); mesh and vision pass silently.
TEST(ResumeFlags, NamesWhatChangesTheBatchesOrNumericsAndIgnoresTheMesh) {
  TrainOptions o;
  const json then = run_flags(o, {1, 1, 2}, 1);
  TrainOptions other_mesh = o;
  other_mesh.parallel.vision = model::VisionMode::gather;
  other_mesh.output.checkpoint_every = 7;
  EXPECT_NO_THROW(check_resume_flags(then, run_flags(other_mesh, {1, 2, 1}, 1), false, "ckpt", nullptr));
  TrainOptions changed = o;
  changed.inputs.seed = 1;
  changed.inputs.dtype = train::parse_compute_dtype("float64");
  changed.inputs.tokens_per_rank = 128;
  const std::string message = error_of([&] {
    check_resume_flags(then, run_flags(changed, {1, 1, 2}, 1), false, "ckpt", nullptr);
  });
  EXPECT_THAT(message, ::testing::HasSubstr("--resume ckpt: this run changes 3 flags"));
  EXPECT_THAT(message, ::testing::HasSubstr("--seed 0 -> 1: another data order"));
  EXPECT_THAT(message, ::testing::HasSubstr("--dtype \"float32\" -> \"float64\": another precision"));
  EXPECT_THAT(message, ::testing::HasSubstr("--tokens-per-rank × world 512 -> 256"));
  std::ostringstream notes;
  EXPECT_NO_THROW(check_resume_flags(then, run_flags(changed, {1, 1, 2}, 1), true, "ckpt", &notes));
  EXPECT_THAT(notes.str(), ::testing::HasSubstr("note: --allow-changed-flags"));
  // A checkpoint from before "tokens_per_step" and "shuffle" were stored: compared on what it has.
  json old = then;
  old.erase("tokens_per_step");
  old.erase("shuffle");
  TrainOptions unshuffled = o;
  unshuffled.inputs.shuffle = false;
  EXPECT_NO_THROW(check_resume_flags(old, run_flags(unshuffled, {1, 1, 2}, 1), false, "ckpt", nullptr));
}

// Each CheckpointTest.Crash* test forks a child that saves with the crash hook set.
int save_in_child(const std::string& dir, int64_t step, const Trained& t, int64_t crash_after, pid_t* child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    CheckpointOptions o;
    o.crash_after_bytes = crash_after;
    try {
      save_checkpoint(dir, step, *t.model, *t.opt, state_json(0, step), kConfig, o);
    } catch (...) { std::_Exit(1); }
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  *child = pid;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(CheckpointTest, CrashInTheMiddleOfASaveLeavesThePreviousCheckpoint) {
  Trained a = trained(3);
  save_checkpoint(dir_, 3, *a.model, *a.opt, state_json(0, 3), kConfig);
  // Write order: hf/config.json, hf/model.safetensors, hf/checksums.json, optimizer.safetensors, ...
  const int64_t model_bytes = static_cast<int64_t>(fs::file_size(dir_ + "/step-000003/hf/model.safetensors") +
                                                   fs::file_size(dir_ + "/step-000003/hf/config.json") +
                                                   fs::file_size(dir_ + "/step-000003/hf/checksums.json"));
  const at::Tensor saved_proj = a.model->proj->weight.clone();
  train_step(*a.model, *a.opt, 1e-3);

  pid_t child = 0;
  ASSERT_EQ(save_in_child(dir_, 5, a, model_bytes + 100, &child), kCheckpointCrashExitCode);
  const std::string tmp = dir_ + "/.step-000005.tmp-" + std::to_string(child);
  ASSERT_TRUE(fs::is_directory(tmp));
  EXPECT_TRUE(fs::is_regular_file(tmp + "/hf/model.safetensors"));
  EXPECT_EQ(fs::file_size(tmp + "/optimizer.safetensors"), 100u);  // cut mid-file
  EXPECT_FALSE(fs::exists(dir_ + "/step-000005"));
  EXPECT_EQ(read_file(dir_ + "/latest"), "step-000003\n");

  const Checkpoint c = load_checkpoint(dir_);
  EXPECT_EQ(c.step, 3);
  at::manual_seed(7);
  auto b = std::make_shared<Tiny>();
  auto ob = make_adamw(named(*b), {});
  restore(c, *b, *ob);
  EXPECT_TRUE(at::equal(b->proj->weight, saved_proj));

  save_checkpoint(dir_, 6, *a.model, *a.opt, state_json(0, 6), kConfig);
  EXPECT_FALSE(fs::exists(tmp));  // the next save removes the leftovers
  EXPECT_EQ(read_file(dir_ + "/latest"), "step-000006\n");
}

TEST_F(CheckpointTest, CrashWhileReplacingLatestKeepsTheOldPointer) {
  Trained a = trained(2);
  save_checkpoint(dir_, 2, *a.model, *a.opt, state_json(0, 2), kConfig);
  // The same checkpoint elsewhere, to learn how many bytes its four files take.
  const std::string probe = dir_ + "/probe";
  save_checkpoint(probe, 4, *a.model, *a.opt, state_json(0, 4), kConfig);
  int64_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(probe + "/step-000004"))
    if (e.is_regular_file()) files += static_cast<int64_t>(e.file_size());
  fs::remove_all(probe);

  pid_t child = 0;
  ASSERT_EQ(save_in_child(dir_, 4, a, files + 5, &child), kCheckpointCrashExitCode);
  EXPECT_TRUE(fs::exists(dir_ + "/step-000004/state.json"));  // complete, but not yet latest
  EXPECT_EQ(read_file(dir_ + "/.latest.tmp-" + std::to_string(child)), "step-");
  EXPECT_EQ(read_file(dir_ + "/latest"), "step-000002\n");
  EXPECT_EQ(load_checkpoint(dir_).step, 2);
}

TEST_F(CheckpointTest, MissingOrCorruptedFilesGiveClearErrors) {
  Trained a = trained(1);
  save_checkpoint(dir_, 1, *a.model, *a.opt, state_json(0, 1), kConfig);
  const std::string step = dir_ + "/step-000001";
  const std::string model = read_file(step + "/hf/model.safetensors");
  // The file checks below the checksums: as an older checkpoint, without manifests.
  fs::remove(step + "/checksums.json");
  fs::remove(step + "/hf/checksums.json");
  EXPECT_THAT(load_checkpoint(dir_).notes.at(0), HasSubstr("has no checksums.json"));

  EXPECT_THAT(error_of([&] { load_checkpoint(dir_ + "/nope"); }), HasSubstr("no such checkpoint directory"));
  fs::create_directories(dir_ + "/empty");
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_ + "/empty"); }), HasSubstr("not a checkpoint"));

  write_file(step + "/hf/model.safetensors", model.substr(0, 20));
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr(step + "/hf/model.safetensors"));
  write_file(step + "/hf/model.safetensors", model);
  fs::rename(step + "/hf", step + "/hf.bak");
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr(step + "/hf: missing"));
  fs::rename(step + "/hf.bak", step + "/hf");

  fs::rename(step + "/optimizer.safetensors", step + "/optimizer.bak");
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr(step + "/optimizer.safetensors: missing"));
  fs::rename(step + "/optimizer.bak", step + "/optimizer.safetensors");

  const std::string state = read_file(step + "/state.json");
  write_file(step + "/state.json", state.substr(0, state.size() / 2));
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr(step + "/state.json: not valid JSON"));
  json bad = json::parse(state);
  bad["data"].erase("offset");
  write_file(step + "/state.json", bad.dump());
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr("data.offset is missing"));
  bad = json::parse(state);
  bad["step"] = 2;
  write_file(step + "/state.json", bad.dump());
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr("does not match the directory name"));
  write_file(step + "/state.json", state);

  write_file(dir_ + "/latest", "../../etc\n");
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr("expected a step dir name"));
  write_file(dir_ + "/latest", "step-000009\n");
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr("names step-000009, which is not"));
  write_file(dir_ + "/latest", "step-000001\n");
  EXPECT_EQ(load_checkpoint(dir_).step, 1);
}

struct Wider : Tiny {
  Wider() : Tiny(5) {}
};

struct Extra : Tiny {
  Extra() { extra = register_parameter("extra", at::zeros({3})); }
  at::Tensor extra;
};

TEST_F(CheckpointTest, MismatchedModelOrOptimizerIsNamedAndChangesNothing) {
  Trained a = trained(1);
  save_checkpoint(dir_, 1, *a.model, *a.opt, state_json(0, 1), kConfig);
  const Checkpoint c = load_checkpoint(dir_);

  Wider wider;
  auto ow = make_adamw(named(wider), {});
  EXPECT_THAT(error_of([&] { restore(c, wider, *ow); }),
              HasSubstr("\"proj.weight\" is [4,3] in model.safetensors, the model's \"proj.weight\" is [5,3]"));

  Extra extra;
  auto oe = make_adamw(named(extra), {});
  EXPECT_THAT(error_of([&] { restore(c, extra, *oe); }), HasSubstr("1 missing from the files, e.g. \"extra\""));

  // The same model, but an optimizer over only some of its parameters.
  at::manual_seed(4);
  Tiny tiny;
  const at::Tensor before = tiny.proj->weight.clone();
  const at::Tensor rng_before = at::detail::getDefaultCPUGenerator().get_state();
  auto partial = make_adamw({{"proj.weight", tiny.proj->weight}}, {});
  EXPECT_THAT(error_of([&] { restore(c, tiny, *partial); }), HasSubstr("optimizer group 0 holds [proj.weight]"));
  EXPECT_TRUE(at::equal(tiny.proj->weight, before));  // nothing changed
  EXPECT_TRUE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), rng_before));
}

TEST_F(CheckpointTest, SaveRefusesBadInputBeforeWritingAnything) {
  Trained a = trained(1);
  EXPECT_THAT(error_of([&] { save_checkpoint(dir_, 1, *a.model, *a.opt, state_json(0, 1), "{oops"); }),
              HasSubstr("config_json: not valid JSON"));
  EXPECT_THAT(error_of([&] {
                save_checkpoint(dir_, 1, *a.model, *a.opt, json{{"run", json::object()}}, kConfig);
              }),
              HasSubstr("data must be an object"));
  json with_step = state_json(0, 1);
  with_step["step"] = 2;
  EXPECT_THAT(error_of([&] { save_checkpoint(dir_, 1, *a.model, *a.opt, with_step, kConfig); }),
              HasSubstr("state.step (2) differs from the step being saved (1)"));
  json unknown = state_json(0, 1);
  unknown["lr"] = 0.1;
  EXPECT_THAT(error_of([&] { save_checkpoint(dir_, 1, *a.model, *a.opt, unknown, kConfig); }),
              HasSubstr("unknown train-state field \"lr\""));
  EXPECT_THAT(error_of([&] { save_checkpoint(dir_, -1, *a.model, *a.opt, state_json(0, 1), kConfig); }),
              HasSubstr("step (-1) must be ≥ 0"));
  EXPECT_TRUE(fs::is_empty(dir_));
}

// ---- integrity: checksums.json -------------------------------------------------------

TEST(XxHash64Test, PublishedVectorsAndStreaming) {
  // xxHash's reference values (xxhsum, XXH64 with seed 0)
  EXPECT_EQ(XxHash64::of(""), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(XxHash64::of("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(XxHash64::of("abc"), 0x44BC2CF5AD770999ULL);
  EXPECT_EQ(XxHash64::hex(XxHash64::of("")), "ef46db3751d8e999");
  // any split of the input gives the one-shot value (the 32-byte stripes and the tail)
  std::string text;
  for (int i = 0; i < 300; ++i) text += static_cast<char>(i * 37 + 11);
  for (size_t n : {0, 1, 7, 31, 32, 33, 64, 100, 299}) {
    const uint64_t whole = XxHash64::of(text.data(), n, 2654435761ULL);
    for (size_t piece : {1, 3, 17, 32, 50}) {
      XxHash64 h(2654435761ULL);
      for (size_t at = 0; at < n; at += piece) h.update(text.data() + at, std::min(piece, n - at));
      EXPECT_EQ(h.digest(), whole) << "n " << n << " piece " << piece;
    }
  }
}

// Every file of a checkpoint (hf/, master/, optimizer, state, the manifests), ~256 bits
// spread over each (headers, data, JSON) flipped in turn: the load refuses, naming the
// flipped file.
TEST_F(CheckpointTest, AFlippedBitAnywhereIsRefusedNamingTheFile) {
  Trained a = trained(1);
  CheckpointOptions options;
  options.save_dtype = at::kFloat;  // proj is fp64: master/ is written too
  save_checkpoint(dir_, 1, named(*a.model), *a.opt, state_json(0, 1), kConfig, options);
  const std::string step = dir_ + "/step-000001";
  ASSERT_TRUE(fs::exists(step + "/master/checksums.json"));
  EXPECT_TRUE(load_checkpoint(dir_).notes.empty());
  int files = 0, flips = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& entry : fs::recursive_directory_iterator(step)) {
    if (!entry.is_regular_file()) continue;
    const std::string path = entry.path().string();
    const std::string original = read_file(path);
    ++files;
    const size_t bits = original.size() * 8;
    const size_t stride = std::max<size_t>(1, bits / 256);  // ~256 bits per file, first byte to last
    for (size_t bit = 0; bit < bits; bit += stride) {
      std::string damaged = original;
      damaged[bit / 8] = static_cast<char>(damaged[bit / 8] ^ (1 << (bit % 8)));
      write_file(path, damaged);
      const std::string error = error_of([&] { load_checkpoint(dir_); });
      ++flips;
      if (error.find(path) == std::string::npos) {
        ADD_FAILURE() << "bit " << bit << " of " << path << ": " << error;
        break;
      }
    }
    write_file(path, original);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d files, %d flipped bits, each refused naming its file (%.2f s)\n", files, flips, seconds);
  EXPECT_GE(files, 8);
  EXPECT_EQ(load_checkpoint(dir_).step, 1);
}

TEST_F(CheckpointTest, ManifestVersionsOlderReadNewerRefused) {
  Trained a = trained(1);
  save_checkpoint(dir_, 1, *a.model, *a.opt, state_json(0, 1), kConfig);
  const std::string step = dir_ + "/step-000001";
  const std::string manifest = read_file(step + "/checksums.json");
  json j = parse_json_text(manifest, "checksums.json");
  EXPECT_EQ(j.at("format_version"), 1);
  EXPECT_TRUE(j.at("files").contains("state.json"));
  EXPECT_TRUE(j.at("files").contains("optimizer.safetensors"));
  EXPECT_TRUE(j.at("files").contains("hf/checksums.json"));
  // a newer mmsp's manifest (its own checksum right): refused naming both versions
  j["format_version"] = 2;
  j.erase("manifest_xxh64");
  j["manifest_xxh64"] = XxHash64::hex(XxHash64::of(j.dump()));
  write_file(step + "/checksums.json", j.dump(2));
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }),
              HasSubstr(step + "/checksums.json: format version 2 is newer than this mmsp reads (version 1)"));
  // an older checkpoint (no manifest): read, with a note
  fs::remove(step + "/checksums.json");
  const Checkpoint c = load_checkpoint(dir_);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_THAT(c.notes[0], HasSubstr("has no checksums.json (a checkpoint of an older mmsp"));
  // a file the manifest lists, gone
  write_file(step + "/checksums.json", manifest);
  fs::remove(step + "/hf/checksums.json");
  EXPECT_THAT(error_of([&] { load_checkpoint(dir_); }), HasSubstr(step + "/hf/checksums.json: missing, but listed"));
}

TEST_F(CheckpointTest, HfDirectoryChecksumsVerifiedWhenPresent) {
  const std::string hf = dir_ + "/hf";
  hf::save_hf_directory(hf, {{"w", at::arange(64, at::kFloat)}}, kConfig);
  EXPECT_TRUE(hf::open_hf_directory(hf).checksums_verified);
  std::string data = read_file(hf + "/model.safetensors");
  data[data.size() - 3] ^= 0x40;  // tensor data
  write_file(hf + "/model.safetensors", data);
  EXPECT_THAT(error_of([&] { hf::open_hf_directory(hf); }), HasSubstr(hf + "/model.safetensors: checksum mismatch"));
  // a released model directory has no checksums.json: read as it is
  fs::remove(hf + "/checksums.json");
  EXPECT_FALSE(hf::open_hf_directory(hf).checksums_verified);
}

// ---- parsers: state.json mutants ------------------------------------------------------

TEST_F(CheckpointTest, StateJsonMutantsEndInAResultOrAnError) {
  Trained a = trained(1);
  save_checkpoint(dir_, 1, *a.model, *a.opt, state_json(3, 7), kConfig);
  const std::string text = read_file(dir_ + "/step-000001/state.json");
  const test::MutantReport r = test::check_mutants(text, 16, 400, [](const std::string& mutant) {
    check_train_state(parse_json_text(mutant, "state.json"), "state.json");
  });
  std::printf("state.json: %d mutants, %d accepted, %d refused, %.2f s\n", r.mutants, r.accepted, r.refused, r.seconds);
  EXPECT_TRUE(r.failures.empty()) << r.failures.size() << " failures, first: " << r.failures.front();
  EXPECT_LT(r.seconds, 20.0);
}

// --- one job per --out (run_directory.h) --------------------------------------------

TEST_F(CheckpointTest, RunDirectoryLockAdmitsOneOwnerAndNamesIt) {
  const std::string out = dir_ + "/run";
  {
    RunDirectoryLock first = RunDirectoryLock::claim(out, "", false);
    EXPECT_TRUE(first.held());
    // flock is per open file: a second claim, even in this process, is another job.
    try {
      RunDirectoryLock::claim(out, "", false);
      ADD_FAILURE() << "a second claim was admitted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("--out " + out + " is in use by another job (pid " +
                                                 std::to_string(::getpid()) + " on "));
    }
    RunDirectoryLock moved = std::move(first);
    EXPECT_TRUE(moved.held());
    EXPECT_FALSE(first.held());
  }
  // the owner gone, the next job claims it at once
  EXPECT_TRUE(RunDirectoryLock::claim(out, "", false).held());
  EXPECT_FALSE(RunDirectoryLock::claim("", "", false).held());  // no --out: nothing to lock
}

TEST_F(CheckpointTest, RunDirectoryLockDiesWithItsOwnerProcess) {
  const std::string out = dir_ + "/run";
  const pid_t child = ::fork();
  if (child == 0) {
    RunDirectoryLock held = RunDirectoryLock::claim(out, "", false);
    ::kill(::getpid(), SIGKILL);  // dies holding it
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(RunDirectoryLock::claim(out, "", false).held());
}

TEST_F(CheckpointTest, AFreshRunRefusesAnotherRunsDirectoryUnlessToldToOverwrite) {
  const std::string out = dir_ + "/run";
  Trained a = trained(2);
  save_checkpoint(out, 2, *a.model, *a.opt, state_json(1, 17), kConfig);
  std::ofstream(out + "/metrics.jsonl") << "{\"step\": 1}\n{\"step\": 2}\n";
  std::ofstream(out + "/notes.txt") << "the user's own file\n";
  EXPECT_THAT(previous_run_files(out), ::testing::ElementsAre("metrics.jsonl (2 lines)", "step-000002", "latest"));
  for (const std::string& elsewhere : std::vector<std::string>{"", dir_ + "/other"}) {
    try {
      RunDirectoryLock::claim(out, elsewhere, false);
      ADD_FAILURE() << "a run into a used --out was admitted (resume '" << elsewhere << "')";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("already holds a run (metrics.jsonl (2 lines), step-000002, latest)"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("--overwrite"));
    }
  }
  // continuing it: the directory itself or a checkpoint in it
  EXPECT_TRUE(RunDirectoryLock::claim(out, out, false).held());
  EXPECT_TRUE(RunDirectoryLock::claim(out, out + "/step-000002", false).held());
  EXPECT_TRUE(fs::exists(out + "/step-000002"));
  // --overwrite: the run's files go, the user's own stay
  EXPECT_TRUE(RunDirectoryLock::claim(out, "", true).held());
  EXPECT_TRUE(previous_run_files(out).empty());
  EXPECT_TRUE(fs::exists(out + "/notes.txt"));
}

}  // namespace
}  // namespace mmsp::train
