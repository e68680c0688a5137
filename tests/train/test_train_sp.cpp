// Training under sequence parallelism equals training in one process: the same loss at
// every step and the same parameters after the steps (fp64, rtol 1e-9), on every mesh
// of the job; and a run stopped and resumed from its checkpoint equals one never
// stopped, bit for bit. Run by mmsp-run with 1-4 ranks (tests named MultiRank*).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "mmsp/dist/all_reduce.h"
#include "mmsp/train/trainer.h"
#include "multirank.h"

namespace mmsp {
namespace {

// A few small steps of the built-in model on the shapes dataset, in fp64.
train::TrainOptions tiny_options(int64_t tokens_per_rank) {
  train::TrainOptions o;
  o.model = "shapes-qwen2-vl";
  o.dtype = "float64";
  o.steps = 3;
  o.tokens_per_rank = tokens_per_rank;
  o.warmup_steps = 1;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.attention_block = 16;
  o.print_steps = false;
  return o;
}

// Loss per step within rtol; every parameter within rtol of its tensor's scale, with
// a floor of rtol/1000 of the model's largest parameter for tensors near zero.
void expect_same_run(const train::TrainReport& got, const train::TrainReport& ref, double rtol,
                     const std::string& where) {
  ASSERT_EQ(got.steps.size(), ref.steps.size()) << where;
  for (size_t i = 0; i < ref.steps.size(); ++i) {
    EXPECT_EQ(got.steps[i].tokens, ref.steps[i].tokens) << where << " step " << ref.steps[i].step;
    EXPECT_EQ(got.steps[i].label_tokens, ref.steps[i].label_tokens) << where << " step " << ref.steps[i].step;
    EXPECT_NEAR(got.steps[i].loss, ref.steps[i].loss, rtol * ref.steps[i].loss) << where << " step " << ref.steps[i].step;
  }
  ASSERT_EQ(got.parameters.size(), ref.parameters.size()) << where;
  double model_scale = 0;
  for (const auto& [name, p] : ref.parameters) model_scale = std::max(model_scale, p.abs().max().item<double>());
  for (size_t i = 0; i < ref.parameters.size(); ++i) {
    const auto& [name, p] = ref.parameters[i];
    ASSERT_EQ(got.parameters[i].first, name) << where;
    const double scale = p.abs().max().item<double>();
    const double diff = (got.parameters[i].second - p).abs().max().item<double>();
    EXPECT_LE(diff, rtol * (scale + 1e-3 * model_scale)) << where << " parameter " << name;
  }
}

// A directory every rank of this job names alike (the launcher's port tells jobs apart).
std::string shared_dir(const std::string& what) {
  const char* port = std::getenv("MASTER_PORT");
  return (std::filesystem::temp_directory_path() /
          ("mmsp-" + what + "-" + (port ? std::string(port) : std::to_string(::getpid()))))
      .string();
}

// ring 2 × ulysses world/2 (ring 3 on 3 ranks): both attention schemes at once.
dist::MeshShape context_shape(int world) {
  const int ring = world % 2 == 0 ? 2 : world;
  return {1, ring, world / ring};
}

void barrier(const dist::Mesh& mesh) {
  at::Tensor t = at::zeros({1});
  dist::all_reduce_(t, *mesh.world());
}

TEST(MultiRankTrain, LossesAndParametersEqualOneProcessOnEveryMesh) {
  const int world = test::rank_env().world_size;
  const int64_t per_rank = 96;
  std::ostringstream log;
  // The one-process run of the same batches: the same global token budget, packed
  // for as many rows as the mesh has dp ranks.
  std::map<int, train::TrainReport> refs;
  auto reference = [&](int dp) -> const train::TrainReport& {
    if (!refs.count(dp)) {
      train::TrainOptions o = tiny_options(per_rank * world);
      o.data_rows = dp;
      refs[dp] = train::train(o, dist::Mesh::solo(), log);
      EXPECT_EQ(refs[dp].steps.size(), 3u);
      for (const auto& s : refs[dp].steps) EXPECT_GT(s.tokens, per_rank * world / 2) << "steps should be well filled";
    }
    return refs[dp];
  };
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;  // 2 K/V heads cannot be split 3 ways
    const train::TrainReport got = train::train(tiny_options(per_rank), mesh, log);
    expect_same_run(got, reference(mesh.shape().dp), 1e-9, mesh.shape().str());
  }
}

// Each vision mode on the widest context mesh trains the same model.
TEST(MultiRankTrain, EveryVisionModeTrainsTheSameModel) {
  const int world = test::rank_env().world_size;
  const int64_t per_rank = 96;
  std::ostringstream log;
  const train::TrainReport ref = train::train(tiny_options(per_rank * world), dist::Mesh::solo(), log);
  const dist::Mesh mesh = test::make_mesh(context_shape(world));
  for (auto mode : {model::VisionMode::gather, model::VisionMode::replicate}) {
    train::TrainOptions o = tiny_options(per_rank);
    o.vision = mode;
    expect_same_run(train::train(o, mesh, log), ref, 1e-9, mesh.shape().str() + " " + model::to_string(mode));
  }
}

// Stop after step 2 (checkpoint), resume, finish: the losses of steps 3-4 and the
// parameters equal an uninterrupted run's exactly.
TEST(MultiRankTrain, StopAndResumeEqualsAnUninterruptedRun) {
  const int world = test::rank_env().world_size;
  const dist::Mesh mesh = test::make_mesh(context_shape(world));
  const std::string whole_dir = shared_dir("train-whole"), split_dir = shared_dir("train-split");
  std::ostringstream log;
  train::TrainOptions o = tiny_options(96);
  o.steps = 4;
  o.checkpoint_every = 2;
  o.out_dir = whole_dir;
  const train::TrainReport whole = train::train(o, mesh, log);

  o.out_dir = split_dir;
  o.stop_after = 2;
  const train::TrainReport first = train::train(o, mesh, log);
  ASSERT_EQ(first.steps.size(), 2u);
  o.stop_after = 0;
  o.resume = split_dir;
  const train::TrainReport rest = train::train(o, mesh, log);
  ASSERT_EQ(rest.first_step, 3);
  ASSERT_EQ(rest.steps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(first.steps[i].loss, whole.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(rest.steps[i].loss, whole.steps[i + 2].loss) << "step " << i + 3;
  }
  for (size_t i = 0; i < whole.parameters.size(); ++i)
    EXPECT_TRUE(at::equal(rest.parameters[i].second, whole.parameters[i].second)) << whole.parameters[i].first;
  barrier(mesh);
  if (mesh.rank() == 0) {
    std::filesystem::remove_all(whole_dir);
    std::filesystem::remove_all(split_dir);
  }
}

}  // namespace
}  // namespace mmsp
