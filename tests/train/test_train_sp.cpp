// Training under sequence parallelism equals training in one process: the same loss at
// every step and the same parameters after the steps (fp64, rtol 1e-9), on every mesh
// of the job; and a run stopped and resumed from its checkpoint equals one never
// stopped, bit for bit. Run by mmsp-run with 1-4 ranks (tests named MultiRank*).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "error_of.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/hf/safetensors.h"
#include "mmsp/model/family.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/model/layers/tiled_mlp.h"
#include "mmsp/model/lora.h"
#include "mmsp/model/model_parts.h"
#include "mmsp/model/vlm.h"
#include "mmsp/train/builtin_models.h"
#include "mmsp/train/logprobs.h"
#include "mmsp/train/trainer.h"
#include "multirank.h"
#include "scratch_dir.h"

namespace mmsp {
namespace {

// Mixed precision against one process after 3 steps: the masters' L2 difference
// relative to their L2 norm, the share of elements that moved differently by more than
// lr/10, the loss. Not fp64's 1e-9, nor an elementwise 1e-5: a mesh sums bf16 partial
// products (and the ring merges bf16 partial outputs) in another order, so gradients
// differ at bf16 round-off (~0.4%), and AdamW's normalised update turns a gradient
// element within round-off of zero into a full ±lr step either way. Measured at
// 2 ranks: L2 4e-4..1.6e-3 (ring 2 the largest), off 0.2..0.7%, loss 4e-5..8e-5.
constexpr double kMixedMasterRtol = 5e-3;
constexpr double kMixedOffShare = 2e-2;
constexpr double kMixedLossRtol = 5e-4;

// A few small steps of the built-in model on the shapes dataset, in fp64.
train::TrainOptions tiny_options(int64_t tokens_per_rank) {
  train::TrainOptions o;
  o.inputs.model = "shapes-qwen2-vl";
  o.inputs.dtype = train::parse_compute_dtype("float64");
  o.schedule.steps = 3;
  o.inputs.tokens_per_rank = tokens_per_rank;
  o.schedule.warmup = 1;
  o.schedule.lr = 1e-2;
  o.schedule.min_lr = 1e-3;
  o.parallel.attention_block = 16;
  o.output.quiet = true;
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
    EXPECT_NEAR(got.steps[i].loss, ref.steps[i].loss, rtol * std::max(std::abs(ref.steps[i].loss), 1e-2))
        << where << " step " << ref.steps[i].step;
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
plan::Mesh context_shape(int world) {
  const int ring = world % 2 == 0 ? 2 : world;
  return {1, ring, world / ring};
}

void barrier(const dist::Mesh& mesh) {
  at::Tensor t = at::zeros({1});
  dist::all_reduce_(t, *mesh.world());
}

// The bytes sent split by purpose: the parts add up to comm_bytes on every step; the
// gradient sync sends on any world > 1, attention only over a context group, vision
// routing only over a context group and never when every rank encodes every image.
void expect_bytes_split(const train::TrainReport& got, const plan::Mesh& shape, model::VisionMode mode,
                        const std::string& where) {
  for (const train::StepMetrics& m : got.steps) {
    const std::string at = where + " step " + std::to_string(m.step);
    EXPECT_EQ(m.attention_bytes + m.vision_bytes + m.grad_bytes + m.expert_bytes, m.comm_bytes) << at;
    EXPECT_EQ(m.grad_bytes > 0, shape.world() > 1) << at;
    EXPECT_EQ(m.attention_bytes > 0, shape.context() > 1) << at;
    if (shape.context() == 1 || mode == model::VisionMode::replicate) { EXPECT_EQ(m.vision_bytes, 0) << at; }
  }
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
      o.inputs.data_rows = dp;
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
    expect_bytes_split(got, mesh.shape(), tiny_options(per_rank).parallel.vision, mesh.shape().str());
  }
}

// --placement adaptive: the same losses and parameters as one process on every mesh, with the
// default balance targets and with loose ones under which these short samples stay whole
// (tests/model's AdaptivePlacement tests assert that such plans mix whole and split).
TEST(MultiRankTrain, AdaptivePlacementEqualsOneProcessOnEveryMesh) {
  const int world = test::rank_env().world_size;
  const int64_t per_rank = 96;
  std::ostringstream log;
  std::map<int, train::TrainReport> refs;
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;  // 2 K/V heads cannot be split 3 ways
    const int dp = mesh.shape().dp;
    if (!refs.count(dp)) {
      train::TrainOptions o = tiny_options(per_rank * world);
      o.inputs.data_rows = dp;
      refs[dp] = train::train(o, dist::Mesh::solo(), log);
    }
    for (const plan::PlacementOptions balance : {plan::PlacementOptions{}, plan::PlacementOptions{1.0, 100.0}}) {
      train::TrainOptions o = tiny_options(per_rank);
      o.parallel.placement = plan::Placement::adaptive;
      o.parallel.placement_balance = balance;
      expect_same_run(train::train(o, mesh, log), refs[dp], 1e-9,
                      mesh.shape().str() + " adaptive, padding up to " + std::to_string(balance.max_padding));
    }
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
    o.parallel.vision = mode;
    const train::TrainReport got = train::train(o, mesh, log);
    expect_same_run(got, ref, 1e-9, mesh.shape().str() + " " + model::to_string(mode));
    expect_bytes_split(got, mesh.shape(), mode, mesh.shape().str() + " " + model::to_string(mode));
  }
}

// Runs `o` for 4 steps whole, then again stopped after step 2 (checkpointed) and
// resumed: steps 1-2, steps 3-4 and the final parameters equal the whole run's
// exactly. `inspect` sees the split run's directory before the resume.
void expect_stop_and_resume_exact(train::TrainOptions o, const dist::Mesh& mesh, const std::string& name,
                                  const std::function<void(const std::string&)>& inspect = {}) {
  const std::string whole_dir = shared_dir(name + "-whole"), split_dir = shared_dir(name + "-split");
  std::ostringstream log;
  o.schedule.steps = 4;
  o.output.checkpoint_every = 2;
  o.output.out = whole_dir;
  const train::TrainReport whole = train::train(o, mesh, log);

  o.output.out = split_dir;
  o.schedule.stop_after = 2;
  const train::TrainReport first = train::train(o, mesh, log);
  ASSERT_EQ(first.steps.size(), 2u);
  if (inspect) inspect(split_dir);
  o.schedule.stop_after = 0;
  o.output.resume = split_dir;
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

// Stop after step 2 (checkpoint), resume, finish: the losses of steps 3-4 and the
// parameters equal an uninterrupted run's exactly.
TEST(MultiRankTrain, StopAndResumeEqualsAnUninterruptedRun) {
  const dist::Mesh mesh = test::make_mesh(context_shape(test::rank_env().world_size));
  expect_stop_and_resume_exact(tiny_options(96), mesh, "train");
}

// A bf16 run whose checkpoints keep hf/ in bf16 resumes from the fp32 masters in
// master/: the resumed steps equal the uninterrupted run's bit for bit.
TEST(MultiRankTrain, MixedPrecisionResumeFromBf16CheckpointsIsExact) {
  const dist::Mesh mesh = test::make_mesh(context_shape(test::rank_env().world_size));
  train::TrainOptions o = tiny_options(96);
  o.inputs.dtype = train::parse_compute_dtype("bfloat16");
  o.output.save_dtype = train::parse_save_dtype("bfloat16");
  expect_stop_and_resume_exact(o, mesh, "train-bf16", [](const std::string& split_dir) {
    EXPECT_TRUE(std::filesystem::is_directory(split_dir + "/step-000002/master"));
    EXPECT_EQ(hf::open_hf_directory(split_dir + "/step-000002/hf").dominant_dtype(), at::kBFloat16);
  });
}

// Mixed precision (bf16 compute, fp32 masters) on every mesh against one process in
// the same mode, within the bounds above (the measured figures are printed).
// Checks `got` against `ref` (both bf16 runs) within the mixed-precision bounds above
// and prints the measured figures.
void expect_mixed_close(const train::TrainReport& got, const train::TrainReport& ref, const dist::Mesh& mesh,
                        const std::string& where) {
  ASSERT_EQ(got.parameters.size(), ref.parameters.size()) << where;
  // Over the whole model: |got - ref| / |ref| (L2), and the share of elements that
  // moved differently by more than a tenth of a step (lr / 10).
  double diff2 = 0, ref2 = 0, off = 0, count = 0;
  for (size_t i = 0; i < ref.parameters.size(); ++i) {
    const at::Tensor& p = ref.parameters[i].second;
    ASSERT_EQ(p.scalar_type(), at::kFloat) << "the report holds the fp32 masters";
    const at::Tensor d = (got.parameters[i].second - p).to(at::kDouble);
    diff2 += d.pow(2).sum().item<double>();
    ref2 += p.to(at::kDouble).pow(2).sum().item<double>();
    off += (d.abs() > 1e-4).sum().item<double>();
    count += static_cast<double>(p.numel());
  }
  const double master_rel = std::sqrt(diff2 / ref2), off_share = off / count;
  double worst_loss = 0;
  for (size_t i = 0; i < ref.steps.size(); ++i)
    worst_loss = std::max(worst_loss, std::abs(got.steps[i].loss - ref.steps[i].loss) / ref.steps[i].loss);
  if (mesh.rank() == 0)
    std::cout << "[ mixed    ] " << where << ": masters L2 rel diff " << master_rel
              << ", elements off by > lr/10: " << off_share << ", loss max rel diff " << worst_loss << std::endl;
  EXPECT_LE(master_rel, kMixedMasterRtol) << where;
  EXPECT_LE(off_share, kMixedOffShare) << where;
  EXPECT_LE(worst_loss, kMixedLossRtol) << where;
}

TEST(MultiRankTrain, MixedPrecisionEqualsOneProcessOnEveryMesh) {
  const int world = test::rank_env().world_size;
  const int64_t per_rank = 96;
  std::ostringstream log;
  auto options = [](int64_t tokens) {
    train::TrainOptions o = tiny_options(tokens);
    o.inputs.dtype = train::parse_compute_dtype("bfloat16");
    o.schedule.lr = 1e-3;
    o.schedule.min_lr = 1e-4;
    return o;
  };
  std::map<int, train::TrainReport> refs;
  for (const dist::Mesh& mesh : test::all_meshes()) {
    if (mesh.shape().ulysses == 3) continue;
    const int dp = mesh.shape().dp;
    if (!refs.count(dp)) {
      train::TrainOptions o = options(per_rank * world);
      o.inputs.data_rows = dp;
      refs[dp] = train::train(o, dist::Mesh::solo(), log);
    }
    expect_mixed_close(train::train(options(per_rank), mesh, log), refs[dp], mesh, mesh.shape().str());
  }
}

// One of the tiny configs (configs/) with the shapes dataset's small vocabulary: the
// same architecture, 128 words instead of 32k-248k (the special ids moved to 120-124),
// so that fp64 runs on every mesh stay quick. `tie`: the LM head is the embedding.
std::string small_vocab_config(const std::string& file, bool tie) {
  std::ifstream in(std::string(MMSP_SOURCE_DIR) + "/configs/" + file);
  nlohmann::json config = nlohmann::json::parse(in);
  const std::map<std::string, int64_t> ids = {
      {"vocab_size", 128},          {"bos_token_id", 1},      {"eos_token_id", 2},     {"vision_start_token_id", 120},
      {"vision_end_token_id", 121}, {"vision_token_id", 122}, {"image_token_id", 123}, {"image_token_index", 123},
      {"video_token_id", 124}};
  for (nlohmann::json* level : {&config, config.contains("text_config") ? &config["text_config"] : nullptr}) {
    if (!level) continue;
    for (const auto& [key, id] : ids)
      if (level->contains(key)) (*level)[key] = id;
  }
  if (config.value("model_type", "") == "internvl") {  // <img>, </img>: defaults unless set
    config["image_start_token_id"] = 120;
    config["image_end_token_id"] = 121;
  }
  config["tie_word_embeddings"] = tie;
  const std::string path = test::scratch_dir("config-") + "/" + file;  // one file per rank
  std::ofstream(path) << config.dump(2);
  return path;
}

// One tiny config per model family, as the memory-flag tests run them: Qwen2-VL with a
// tied head, Qwen3-VL (deepstack), LLaVA and the Qwen3.5 hybrid.
struct FamilyCase {
  const char* file;
  bool tie;
  int max_ulysses;        // Qwen3.5: 2 linear-attention key heads
  int64_t per_rank = 96;  // tokens per rank of the checkpointing run
};
const std::vector<FamilyCase>& family_cases() {
  static const std::vector<FamilyCase> cases = {{"tiny-qwen2-vl.json", true, 4},
                                                {"tiny-qwen3-vl.json", false, 4},
                                                {"tiny-llava.json", false, 4},
                                                {"tiny-qwen3_5-vl.json", false, 2}};
  return cases;
}

// Activation checkpointing and a chunked LM head change memory, not numerics: every
// mesh with --checkpoint-activations all, and chunks of 7 tokens (they cross sequence
// and shard borders; the last one is partial), equals one process with neither (fp64,
// rtol 1e-9), for each model family: Qwen2-VL (tied head), Qwen2.5-VL (windowed vision
// blocks, videos at scaled times), Qwen3-VL (deepstack), LLaVA, the Qwen3.5 hybrid
// (Gated DeltaNet layers) and InternVL (the shapes dynamically tiled). `all` recomputes
// the decoder layers as `decoder` does, and the vision blocks as well (they hold no collective), so
// `decoder` runs on the widest context mesh only; and rank 0 alone runs the references
// and compares (every rank holds the same losses and parameters), to keep it short.
TEST(MultiRankEveryFamily, CheckpointingAndChunkedLossEqualOneProcessOnEveryMesh) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  const plan::Mesh widest = context_shape(world);
  std::ostringstream log;
  std::vector<FamilyCase> cases = family_cases();
  cases.insert(cases.begin() + 1, FamilyCase{"tiny-qwen2_5-vl.json", false, 4});
  // InternVL: a sample of 3 images can reach 3 × 13 tiles × 4 rows + text
  cases.push_back(FamilyCase{"tiny-internvl.json", false, 4, 192});
  for (const FamilyCase& c : cases) {
    const int64_t per_rank = c.per_rank;
    const std::string config_path = small_vocab_config(c.file, c.tie);
    std::map<int, train::TrainReport> refs;
    for (const dist::Mesh& mesh : test::all_meshes()) {
      const plan::Mesh& shape = mesh.shape();
      if (shape.ulysses == 3 || shape.ulysses > c.max_ulysses) continue;  // heads cannot be split so
      if (checker && !refs.count(shape.dp)) {
        train::TrainOptions o = tiny_options(per_rank * world);
        o.inputs.model = config_path;
        o.inputs.data_rows = shape.dp;
        refs[shape.dp] = train::train(o, dist::Mesh::solo(), log);
      }
      std::vector<model::ActivationCheckpointing> modes = {model::ActivationCheckpointing::all};
      if (shape.str() == widest.str()) modes.push_back(model::ActivationCheckpointing::decoder);
      for (auto mode : modes) {
        train::TrainOptions o = tiny_options(per_rank);
        o.inputs.model = config_path;
        o.memory.checkpoint_activations = mode;
        o.memory.loss_chunk = 7;
        // decoder on the widest mesh: with the memory layers too (MLPs in tiles of 3, offload)
        if (mode == model::ActivationCheckpointing::decoder) {
          o.memory.tiled_mlp = 3;
          o.memory.offload_activations = true;
        }
        const train::TrainReport got = train::train(o, mesh, log);
        if (checker)
          expect_same_run(got, refs[shape.dp], 1e-9,
                          std::string(c.file) + " " + shape.str() + " " + model::to_string(mode) +
                              (o.memory.offload_activations ? " offloaded, tiled MLP" : ""));
      }
    }
    std::filesystem::remove(config_path);
  }
}

// --attention-kernel fused: the fused kernel's plan (on the CPU, ATen's flash kernel; on
// CUDA, FlashAttention-2 varlen) in every attention of a training run — the decoder's
// ring and Ulysses steps and the vision towers — against one process on mmsp's blockwise
// kernel: the same losses and parameters (fp64, 1e-9), for a plain and a hybrid decoder.
TEST(MultiRankTrain, FusedAttentionKernelTrainsAsTheBlockwiseOne) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  const plan::Mesh widest = context_shape(world);
  std::ostringstream log;
  for (const FamilyCase& c :
       {FamilyCase{"tiny-qwen2-vl.json", false, 4}, FamilyCase{"tiny-qwen3_5-vl.json", true, 2}}) {
    const std::string config_path = small_vocab_config(c.file, c.tie);
    train::TrainReport ref;
    if (checker) {
      train::TrainOptions o = tiny_options(96 * world);
      o.inputs.model = config_path;
      o.parallel.attention_kernel = attention::parse_attention_kernel("blockwise");
      ref = train::train(o, dist::Mesh::solo(), log);
    }
    for (const dist::Mesh& mesh : test::all_meshes()) {
      if (mesh.shape().str() != widest.str() || widest.ulysses > c.max_ulysses) continue;
      train::TrainOptions o = tiny_options(96);
      o.inputs.model = config_path;
      o.parallel.attention_kernel = attention::parse_attention_kernel("fused");
      const train::TrainReport got = train::train(o, mesh, log);
      if (checker) expect_same_run(got, ref, 1e-9, std::string(c.file) + " fused " + mesh.shape().str());
    }
    std::filesystem::remove(config_path);
  }
}

// Mixed precision with both flags on the widest context mesh: within bf16's bounds of
// the same run without them (recomputation repeats the bf16 forward exactly; the chunked
// loss sums the head's gradient in fp32 instead of one bf16 matmul).
TEST(MultiRankTrain, MixedPrecisionWithCheckpointingAndChunkedLoss) {
  const dist::Mesh mesh = test::make_mesh(context_shape(test::rank_env().world_size));
  std::ostringstream log;
  train::TrainOptions o = tiny_options(96);
  o.inputs.dtype = train::parse_compute_dtype("bfloat16");
  o.schedule.lr = 1e-3;
  o.schedule.min_lr = 1e-4;
  const train::TrainReport ref = train::train(o, mesh, log);
  o.memory.checkpoint_activations = model::ActivationCheckpointing::all;
  o.memory.loss_chunk = 7;
  expect_mixed_close(train::train(o, mesh, log), ref, mesh, mesh.shape().str() + " all, chunk 7");
}

// A fine-tune starts from a run's hf/ directory: the weights load bitwise, and the
// fine-tune itself is inside the invariant (every mesh equals one process, fp64).
TEST(MultiRankTrain, FineTuneFromAHfDirectoryOnEveryMesh) {
  const int world = test::rank_env().world_size;
  const dist::Mesh mesh = test::make_mesh(context_shape(world));
  const std::string run_dir = shared_dir("train-hf");
  std::ostringstream log;
  train::TrainOptions o = tiny_options(96);
  o.schedule.steps = 2;
  o.output.out = run_dir;
  o.output.save_shard_bytes = 200'000;  // several shards, as a released model has
  const train::TrainReport run = train::train(o, mesh, log);
  const std::string hf = run_dir + "/step-000002/hf";
  const hf::HfDirectory dir = hf::open_hf_directory(hf);
  EXPECT_TRUE(dir.indexed);
  EXPECT_GT(dir.files.size(), 2u);
  // The directory holds the run's parameters bit for bit.
  std::vector<std::pair<std::string, at::Tensor>> loaded;
  for (const auto& [name, p] : run.parameters) loaded.emplace_back(name, at::zeros_like(p));
  hf::load_hf_weights(dir, loaded, {});
  for (size_t i = 0; i < loaded.size(); ++i)
    EXPECT_TRUE(at::equal(loaded[i].second, run.parameters[i].second)) << loaded[i].first;
  barrier(mesh);

  train::TrainOptions fine = tiny_options(96);
  fine.inputs.model = hf;
  fine.inputs.seed = 7;  // other data order: the weights, not the seed, carry the run over
  const train::TrainReport ref = [&] {
    train::TrainOptions one = fine;
    one.inputs.tokens_per_rank = 96 * world;
    return train::train(one, dist::Mesh::solo(), log);
  }();
  for (const dist::Mesh& m : test::all_meshes()) {
    if (m.shape().ulysses == 3) continue;
    if (m.shape().dp != 1) continue;  // the reference packs one row
    expect_same_run(train::train(fine, m, log), ref, 1e-9, "fine-tune " + m.shape().str());
  }
  barrier(mesh);
  if (mesh.rank() == 0) std::filesystem::remove_all(run_dir);
}

// --overlap-communication off and on (the ring's next K/V and its dK/dV home issued before
// the block computes, ZeRO-3's next unit gathered before the unit computes) train the same
// model bit for bit: the overlap moves when the bytes travel, never which sums are made or
// in which order. A ring of every rank, --shard parameters, fp64, 2 steps.
TEST(MultiRankTrain, OverlapOnEqualsOffBitwise) {
  const int world = test::rank_env().world_size;
  if (world == 1) GTEST_SKIP() << "no ring on one rank";
  std::ostringstream log;
  const dist::Mesh mesh = test::make_mesh({1, world, 1});
  std::vector<train::TrainReport> runs;
  for (bool overlap : {false, true}) {
    train::TrainOptions o = tiny_options(96);
    o.schedule.steps = 2;
    o.parallel.shard = parallel::parse_shard_level("parameters");
    o.parallel.overlap_communication = overlap;
    runs.push_back(train::train(o, mesh, log));
  }
  const train::TrainReport &off = runs[0], &on = runs[1];
  ASSERT_EQ(on.steps.size(), 2u);
  ASSERT_EQ(on.steps.size(), off.steps.size());
  for (size_t i = 0; i < on.steps.size(); ++i) {
    EXPECT_EQ(on.steps[i].loss, off.steps[i].loss) << "step " << on.steps[i].step;
    EXPECT_GT(on.steps[i].attention_bytes, 0) << "the ring must exchange";
  }
  ASSERT_EQ(on.parameters.size(), off.parameters.size());
  for (size_t i = 0; i < on.parameters.size(); ++i)
    EXPECT_TRUE(on.parameters[i].second.equal(off.parameters[i].second)) << on.parameters[i].first;
}

// --shard optimizer on a context mesh (also with --checkpoint-activations all and
// --loss-chunk 7) and on a data-parallel one trains the model one process trains with
// none of them (fp64, rtol 1e-9: only the order of the sums differs).
TEST(MultiRankTrain, ShardedOptimizerEqualsOneProcess) {
  const int world = test::rank_env().world_size;
  const int64_t per_rank = 96;
  std::ostringstream log;
  for (const plan::Mesh& shape : {context_shape(world), plan::Mesh{world, 1, 1}}) {
    if (shape.ulysses == 3) continue;  // 2 K/V heads cannot be split 3 ways
    train::TrainOptions one = tiny_options(per_rank * world);
    one.inputs.data_rows = shape.dp;
    const train::TrainReport ref = train::train(one, dist::Mesh::solo(), log);
    train::TrainOptions o = tiny_options(per_rank);
    o.parallel.shard = parallel::parse_shard_level("optimizer");
    const dist::Mesh mesh = test::make_mesh(shape);
    expect_same_run(train::train(o, mesh, log), ref, 1e-9, "--shard optimizer " + shape.str());
    if (shape.dp != 1) continue;
    // with the other two memory flags: recomputed layers and a loss in chunks of 7 tokens
    o.memory.checkpoint_activations = model::ActivationCheckpointing::all;
    o.memory.loss_chunk = 7;
    expect_same_run(train::train(o, mesh, log), ref, 1e-9, "--shard optimizer, checkpointing, chunks " + shape.str());
  }
}

// --shard gradients and parameters (ZeRO-2/3: gradients reduce-scattered and weights
// gathered and freed layer by layer, inside the backward) train the model one process
// trains with none of them (fp64, rtol 1e-9), for each model family, on the widest
// context mesh with and without recomputed layers (the hooks then wrap the recomputing
// node), and on a data-parallel mesh. Rank 0 runs the references and compares.
TEST(MultiRankEveryFamily, ShardedGradientsAndParametersEqualOneProcess) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  const int64_t per_rank = 96;
  std::ostringstream log;
  for (const FamilyCase& c : family_cases()) {
    const std::string config_path = small_vocab_config(c.file, c.tie);
    plan::Mesh widest = context_shape(world);
    if (widest.ulysses > c.max_ulysses) widest = {1, world, 1};
    if (widest.ulysses == 3) widest = {1, world, 1};
    for (const plan::Mesh& shape : {widest, plan::Mesh{world, 1, 1}}) {
      train::TrainReport ref;
      if (checker) {
        train::TrainOptions o = tiny_options(per_rank * world);
        o.inputs.model = config_path;
        o.inputs.data_rows = shape.dp;
        ref = train::train(o, dist::Mesh::solo(), log);
      }
      const dist::Mesh mesh = test::make_mesh(shape);
      for (const char* level : {"gradients", "parameters"}) {
        for (auto mode : {model::ActivationCheckpointing::none, model::ActivationCheckpointing::all}) {
          if (shape.dp != 1 && (mode != model::ActivationCheckpointing::none || std::string(level) == "gradients"))
            continue;  // data parallel: stage 3 alone
          train::TrainOptions o = tiny_options(per_rank);
          o.inputs.model = config_path;
          o.parallel.shard = parallel::parse_shard_level(level);
          o.memory.checkpoint_activations = mode;
          if (mode != model::ActivationCheckpointing::none) o.memory.loss_chunk = 7;
          const train::TrainReport got = train::train(o, mesh, log);
          if (checker)
            expect_same_run(
                got, ref, 1e-9,
                std::string(c.file) + " --shard " + level + " " + shape.str() + " " + model::to_string(mode));
        }
      }
      // The memory layers under ZeRO-3: MLPs in tiles of 5 tokens (the last one of a
      // rank short), recomputed layers' inputs offloaded (on the CPU, the copy path).
      if (shape.dp == 1) {
        train::TrainOptions o = tiny_options(per_rank);
        o.inputs.model = config_path;
        o.parallel.shard = parallel::parse_shard_level("parameters");
        o.memory.checkpoint_activations = model::ActivationCheckpointing::all;
        o.memory.offload_activations = true;
        o.memory.tiled_mlp = 5;
        const train::TrainReport got = train::train(o, mesh, log);
        if (checker)
          expect_same_run(got, ref, 1e-9,
                          std::string(c.file) +
                              " --shard parameters --tiled-mlp 5 "
                              "--offload-activations " +
                              shape.str());
      }
    }
    std::filesystem::remove(config_path);
  }
}

// Qwen3-VL-MoE (fused experts, a dense layer) and Qwen3.5-MoE (per-expert weights, the shared
// expert), the auxiliary loss on: three steps on the widest context mesh with every expert
// degree that splits the world and the 8 experts (folded into ring × Ulysses), on the
// data-parallel mesh with expert 2, and under ZeRO (--expert 1 and above 1: stage 3 with
// recomputed layers, stage 1 with expert 2, stage 2 on the dp mesh) and with --accumulate 2,
// train the model one process trains (losses, aux included, and every
// weight, the experts gathered whole: fp64, rtol 1e-9). The metrics count the experts'
// tokens per expert rank (every pick of the step, summed over layers), their imbalance, and
// the exchange's bytes, which only an expert group of more than one rank sends.
TEST(MultiRankEveryFamily, MixtureOfExpertsTrainAsOneProcessWithExpertParallelism) {
  const int world = test::rank_env().world_size;
  // One rank is the reference itself; 2, 3 (uneven, expert 1) and 4 ranks run (CI's time).
  if (world == 1) GTEST_SKIP() << "MoE training runs on 2-4 ranks";
  const bool checker = test::rank_env().rank == 0;
  const plan::Mesh widest = context_shape(world);
  std::ostringstream log;
  for (const FamilyCase& c :
       {FamilyCase{"tiny-qwen3-vl-moe.json", false, 4}, FamilyCase{"tiny-qwen3_5-moe.json", false, 2}}) {
    const std::string config_path = small_vocab_config(c.file, c.tie);
    std::vector<plan::Mesh> shapes;
    for (int e = 1; e <= world; e *= 2)
      if (world % e == 0 && (widest.ulysses <= c.max_ulysses && widest.ulysses != 3))
        shapes.push_back({widest.dp, widest.ring, widest.ulysses, e});
    if (world % 2 == 0) shapes.push_back({world, 1, 1, 2});
    std::map<int, train::TrainReport> refs;
    for (const plan::Mesh& shape : shapes) {
      if (checker && !refs.count(shape.dp)) {
        train::TrainOptions o = tiny_options(96 * world);
        o.inputs.model = config_path;
        o.inputs.data_rows = shape.dp;
        refs[shape.dp] = train::train(o, dist::Mesh::solo(), log);
      }
      const dist::Mesh mesh = test::make_mesh(shape);
      std::vector<std::pair<parallel::ShardLevel, model::ActivationCheckpointing>> runs = {
          {parallel::ShardLevel::none, model::ActivationCheckpointing::none}};
      if (shape.expert == 1)
        runs.push_back({parallel::ShardLevel::parameters, model::ActivationCheckpointing::decoder});
      // ZeRO with expert parallelism: the experts' shards over their replicas (2 ranks with
      // expert 2, the rank alone with expert 4), the rest over the world.
      if (shape.expert > 1 && shape.dp == 1) {
        if (shape.expert == 2) runs.push_back({parallel::ShardLevel::optimizer, model::ActivationCheckpointing::none});
        runs.push_back({parallel::ShardLevel::parameters, model::ActivationCheckpointing::decoder});
      }
      if (shape.expert > 1 && shape.dp > 1)
        runs.push_back({parallel::ShardLevel::gradients, model::ActivationCheckpointing::none});
      for (const auto& [level, mode] : runs) {
        train::TrainOptions o = tiny_options(96);
        o.inputs.model = config_path;
        o.parallel.shard = level;
        o.memory.checkpoint_activations = mode;
        const train::TrainReport got = train::train(o, mesh, log);
        const std::string where = std::string(c.file) + " " + shape.str() + " --shard " + parallel::to_string(level);
        const int64_t sparse_layers = std::string(c.file) == "tiny-qwen3-vl-moe.json" ? 3 : 4;  // mlp_only_layers [1]
        for (const train::StepMetrics& m : got.steps) {
          EXPECT_EQ(m.expert_tokens.size(), static_cast<size_t>(shape.expert)) << where;
          int64_t picks = 0;
          for (int64_t n : m.expert_tokens) picks += n;
          EXPECT_EQ(picks, m.tokens * 2 * sparse_layers)
              << where << ": every real token's 2 picks in every sparse layer";
          EXPECT_GE(m.expert_imbalance, 1.0) << where;
          EXPECT_EQ(m.expert_bytes > 0, shape.expert > 1) << where;
        }
        expect_bytes_split(got, shape, model::VisionMode::routed, where);
        if (checker) expect_same_run(got, refs[shape.dp], 1e-9, where);
      }
    }
    // --accumulate 2: the step's aux loss is its micro-batches' mean (each routed in its own
    // forward); expert 2 under ZeRO-2, whose hooks add each micro-step's expert shards.
    if (world % 2 == 0) {
      train::TrainReport ref;
      if (checker) {
        train::TrainOptions one = tiny_options(96 * world);
        one.inputs.model = config_path;
        one.schedule.accumulate = 2;
        ref = train::train(one, dist::Mesh::solo(), log);
      }
      train::TrainOptions o = tiny_options(96);
      o.inputs.model = config_path;
      o.schedule.accumulate = 2;
      o.parallel.shard = parallel::ShardLevel::gradients;
      const plan::Mesh shape{widest.dp, widest.ring, widest.ulysses, 2};
      const train::TrainReport got = train::train(o, test::make_mesh(shape), log);
      if (checker) expect_same_run(got, ref, 1e-9, std::string(c.file) + " --accumulate 2 " + shape.str());
    }
    std::filesystem::remove(config_path);
  }
}

// Under --shard gradients|parameters the vision blocks are hook units too: gathered
// before their forward and their backward, reduced after it. A rank that encodes no image
// runs them on no rows, so that every rank calls the same hooks in the same order. Data
// where one short sequence in four has one image (the other ranks encode nothing, and
// some steps no rank does) trains the model one process trains (fp64, rtol 1e-9), with
// and without recomputed blocks, for every tower: Qwen2-VL (tied head), Qwen2.5-VL
// (windows), Qwen3-VL (deepstack), LLaVA (CLIP, whose last layer never runs:
// vision_feature_layer −2) and InternVL (InternViT, pixel shuffle).
TEST(MultiRankEveryFamily, HookedVisionBlocksRunOnRanksWithoutImages) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  struct SparseCase {
    FamilyCase family;
    std::vector<int64_t> image;  // the image's placeholder tokens (small_vocab_config's ids)
    nlohmann::json grid;         // image_grid_thw, or null: the family's from the file
  };
  const std::vector<int64_t> qwen = {120, 123, 121};  // one merged patch: grid [1, 2, 2]
  const std::vector<SparseCase> cases = {
      {{"tiny-qwen2-vl.json", true, 4, 64}, qwen, {{1, 2, 2}}},
      {{"tiny-qwen2_5-vl.json", false, 4, 64}, qwen, {{1, 2, 2}}},
      {{"tiny-qwen3-vl.json", false, 4, 64}, qwen, {{1, 2, 2}}},
      {{"tiny-llava.json", false, 4, 96}, std::vector<int64_t>(16, 123), nullptr},  // 56 px: 4 × 4 patches
      // 56 px: one tile, 4 rows after the pixel shuffle, between <img> and </img>
      {{"tiny-internvl.json", false, 4, 96}, {120, 123, 123, 123, 123, 121}, nullptr}};
  std::ostringstream log;
  for (const SparseCase& c : cases) {
    const std::string data = test::scratch_dir("sparse-images-") + "/data.jsonl";  // per rank
    {
      std::ofstream out(data);
      for (int line = 0; line < 12; ++line) {
        nlohmann::json sample;
        std::vector<int64_t> ids = {1};
        if (line % 4 == 1) ids.insert(ids.end(), c.image.begin(), c.image.end());
        for (int k = 0; k < 20 + 7 * (line % 5); ++k) ids.push_back(3 + (line * 11 + k * 5) % 110);
        ids.push_back(2);
        sample["input_ids"] = ids;
        if (line % 4 == 1) {
          sample["images"] = {{{"path", std::string(MMSP_SOURCE_DIR) + "/examples/data/circle.png"}}};
          if (!c.grid.is_null()) sample["image_grid_thw"] = c.grid;
        }
        out << sample.dump() << "\n";
      }
    }
    const int64_t per_rank = c.family.per_rank;
    const std::string config_path = small_vocab_config(c.family.file, c.family.tie);
    const plan::Mesh shape = context_shape(world).ulysses == 3 ? plan::Mesh{1, world, 1} : context_shape(world);
    train::TrainReport ref;
    if (checker) {
      train::TrainOptions o = tiny_options(per_rank * world);
      o.inputs.model = config_path;
      o.inputs.data = data;
      ref = train::train(o, dist::Mesh::solo(), log);
    }
    const dist::Mesh mesh = test::make_mesh(shape);
    for (const char* level : {"gradients", "parameters"})
      for (auto mode : {model::ActivationCheckpointing::none, model::ActivationCheckpointing::all}) {
        train::TrainOptions o = tiny_options(per_rank);
        o.inputs.model = config_path;
        o.inputs.data = data;
        o.parallel.shard = parallel::parse_shard_level(level);
        o.memory.checkpoint_activations = mode;
        const train::TrainReport got = train::train(o, mesh, log);
        if (checker)
          expect_same_run(got, ref, 1e-9,
                          std::string(c.family.file) + " sparse images --shard " + level + " " + shape.str() + " " +
                              model::to_string(mode));
      }
    std::filesystem::remove(config_path);
    std::filesystem::remove(data);  // this rank's copy
  }
}

// Vision-tower SP in training: an image of 8 × 12 patches (24 merged rows; Qwen2.5-VL: a
// 4 × 4-unit window and one cut short) in every other sample is encoded by the whole
// context group (--vision-split 16), the small 2 × 2 images beside it whole, with the
// towers' 12 heads over 2-4 ranks; LLaVA's 4 × 4-patch images are all split (the class
// token on rank 0). Unsharded, and under --shard gradients|parameters (the blocks gathered
// and reduced around the split item's exchanges) with and without
// --checkpoint-activations all (the exchanges recomputed in the backward, in the same
// order on every rank), three steps train the model one process trains (fp64, rtol 1e-9),
// for each tower that splits by exchange.
TEST(MultiRankEveryFamily, SplitVisionItemsTrainTheModelOneProcessTrains) {
  const int world = test::rank_env().world_size;
  if (world == 1) GTEST_SKIP() << "one rank: nothing to split over";
  const bool checker = test::rank_env().rank == 0;
  std::ostringstream log;
  struct SplitCase {
    const char* file;
    std::vector<int64_t> big, small;      // an image's tokens (small_vocab_config's ids)
    nlohmann::json big_grid, small_grid;  // image_grid_thw, or null: the family's from the file
  };
  auto qwen_block = [](int rows) {
    std::vector<int64_t> ids = {120};
    ids.insert(ids.end(), rows, 123);
    ids.push_back(121);
    return ids;
  };
  const nlohmann::json big = {{1, 8, 12}}, small = {{1, 2, 2}};
  const std::vector<SplitCase> cases = {
      {"tiny-qwen2-vl.json", qwen_block(24), qwen_block(1), big, small},
      {"tiny-qwen2_5-vl.json", qwen_block(24), qwen_block(1), big, small},
      {"tiny-qwen3-vl.json", qwen_block(24), qwen_block(1), big, small},
      {"tiny-qwen3_5-vl.json", qwen_block(24), qwen_block(1), big, small},
      {"tiny-llava.json", std::vector<int64_t>(16, 123), std::vector<int64_t>(16, 123), nullptr, nullptr}};
  for (const SplitCase& c : cases) {
    std::string config_path = small_vocab_config(c.file, false);
    {
      std::ifstream in(config_path);
      nlohmann::json config = nlohmann::json::parse(in);
      const bool qwen2 = config["model_type"] == "qwen2_vl", llava = config["model_type"] == "llava";
      config["vision_config"][qwen2 ? "embed_dim" : "hidden_size"] = 48;
      config["vision_config"][llava ? "num_attention_heads" : "num_heads"] = 12;
      std::ofstream(config_path) << config.dump(2);
    }
    const std::string data = test::scratch_dir("split-images-") + "/data.jsonl";  // per rank
    {
      std::ofstream out(data);
      for (int line = 0; line < 8; ++line) {
        nlohmann::json sample;
        std::vector<int64_t> ids = {1};
        const bool large = line % 2 == 1, tiny = line % 4 == 0;
        if (large || tiny) ids.insert(ids.end(), (large ? c.big : c.small).begin(), (large ? c.big : c.small).end());
        for (int k = 0; k < 20 + 7 * (line % 5); ++k) ids.push_back(3 + (line * 13 + k * 5) % 110);
        ids.push_back(2);
        sample["input_ids"] = ids;
        if (large || tiny) {
          sample["images"] = {{{"path", std::string(MMSP_SOURCE_DIR) + "/examples/data/circle.png"}}};
          const nlohmann::json& grid = large ? c.big_grid : c.small_grid;
          if (!grid.is_null()) sample["image_grid_thw"] = grid;
        }
        out << sample.dump() << "\n";
      }
    }
    const plan::Mesh shape = context_shape(world).ulysses == 3 ? plan::Mesh{1, world, 1} : context_shape(world);
    train::TrainReport ref;
    if (checker) {
      train::TrainOptions o = tiny_options(128 * world);
      o.inputs.model = config_path;
      o.inputs.data = data;
      ref = train::train(o, dist::Mesh::solo(), log);
    }
    const dist::Mesh mesh = test::make_mesh(shape);
    using AC = model::ActivationCheckpointing;
    const std::pair<const char*, AC> runs[] = {
        {"none", AC::none}, {"gradients", AC::all}, {"parameters", AC::none}, {"parameters", AC::all}};
    for (const auto& [level, mode] : runs) {
      train::TrainOptions o = tiny_options(128);
      o.inputs.model = config_path;
      o.inputs.data = data;
      o.parallel.shard = parallel::parse_shard_level(level);
      o.memory.checkpoint_activations = mode;
      o.parallel.vision_split = plan::parse_vision_split("16");
      const train::TrainReport got = train::train(o, mesh, log);
      if (checker)
        expect_same_run(
            got, ref, 1e-9,
            std::string(c.file) + " split images --shard " + level + " " + shape.str() + " " + model::to_string(mode));
    }
    std::filesystem::remove(config_path);
    std::filesystem::remove(data);
  }
}

// Saved with --shard parameters on this world (one optimizer file per rank; the decoder
// layers gathered to write hf/), the checkpoint resumes on one rank at every shard
// level, and on this world unsharded; an unsharded checkpoint resumes sharded. Every
// continuation equals the uninterrupted --shard optimizer run (fp64, rtol 1e-9).
TEST(MultiRankTrain, ShardedCheckpointsResumeOnAnyWorldEitherWay) {
  const int world = test::rank_env().world_size;
  const dist::Mesh mesh = test::make_mesh(context_shape(world));
  const std::string sharded_dir = shared_dir("shard-saved"), replicated_dir = shared_dir("shard-replicated");
  std::ostringstream log;
  train::TrainOptions o = tiny_options(96);
  o.schedule.steps = 4;
  o.parallel.shard = parallel::parse_shard_level("optimizer");
  const train::TrainReport whole = train::train(o, mesh, log);
  auto save_two = [&](const std::string& shard, const std::string& dir) {
    train::TrainOptions first = o;
    first.parallel.shard = parallel::parse_shard_level(shard);
    first.output.out = dir;
    first.schedule.stop_after = 2;
    train::train(first, mesh, log);
  };
  save_two("parameters", sharded_dir);  // ZeRO-3 gathers the decoder layers to save hf/
  save_two("none", replicated_dir);
  barrier(mesh);
  const std::string step_dir = sharded_dir + "/step-000002";
  for (int r = 0; r < world; ++r) {
    char file[64];
    std::snprintf(file, sizeof file, "/optimizer/rank-%05d-of-%05d.safetensors", r, world);
    EXPECT_TRUE(std::filesystem::is_regular_file(step_dir + file)) << file;
  }
  EXPECT_FALSE(std::filesystem::exists(step_dir + "/optimizer.safetensors"));
  auto expect_continues = [&](const train::TrainReport& rest, const std::string& where) {
    ASSERT_EQ(rest.first_step, 3) << where;
    ASSERT_EQ(rest.steps.size(), 2u) << where;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(rest.steps[i].loss, whole.steps[i + 2].loss, 1e-9 * whole.steps[i + 2].loss) << where;
    for (size_t i = 0; i < whole.parameters.size(); ++i) {
      const at::Tensor& want = whole.parameters[i].second;
      EXPECT_TRUE(at::allclose(rest.parameters[i].second, want, 1e-9, 1e-12))
          << where << " " << whole.parameters[i].first;
    }
  };
  for (const char* shard : {"none", "optimizer", "parameters"}) {
    train::TrainOptions one = o;
    one.inputs.tokens_per_rank = 96 * world;
    one.parallel.shard = parallel::parse_shard_level(shard);
    one.output.resume = sharded_dir;
    expect_continues(train::train(one, dist::Mesh::solo(), log), std::string("1 rank, --shard ") + shard);
  }
  train::TrainOptions again = o;
  again.parallel.shard = parallel::parse_shard_level("none");
  again.output.resume = sharded_dir;
  expect_continues(train::train(again, mesh, log), "this world, --shard none");
  again.parallel.shard = parallel::parse_shard_level("gradients");
  again.output.resume = replicated_dir;
  expect_continues(train::train(again, mesh, log), "this world from an unsharded checkpoint, --shard gradients");
  barrier(mesh);
  if (mesh.rank() == 0) {
    std::filesystem::remove_all(sharded_dir);
    std::filesystem::remove_all(replicated_dir);
  }
}

// --prefetch-pixels: the next step's images and videos decoded on a thread while this step
// trains are the pixels the step would load itself: four steps of examples/data (images,
// a frame-folder video) train the same model bit for bit with it on and off (2 ranks).
// On the CPU the step's memory check counts them (the largest rank's, pixels and 8-bit
// frames: train/memory/vision_load.h), and each step's measured peak stays under its
// estimate; under a limit that only the prefetched pixels pass, the steps load their own
// pixels instead (the same model again) and nothing is refused.
TEST(MultiRankTrain, PrefetchedPixelsTrainTheSameModel) {
  const int world = test::rank_env().world_size;
  if (world != 2) GTEST_SKIP() << "one mesh is enough: the pixels are each rank's own";
  const dist::Mesh mesh = test::make_mesh(context_shape(world));
  std::ostringstream log;
  train::TrainOptions o = tiny_options(96);
  o.inputs.model = std::string(MMSP_SOURCE_DIR) + "/configs/tiny-qwen2-vl.json";
  o.inputs.data = std::string(MMSP_SOURCE_DIR) + "/examples/data/data.jsonl";
  o.schedule.steps = 3;  // two steps that prefetch, and the last
  o.output.report_steps = true;
  const train::TrainReport off = train::train(o, mesh, log);
  EXPECT_EQ(off.memory_estimate.next_pixels, 0) << "auto prefetches nothing on the CPU";
  o.memory.prefetch_pixels = train::PrefetchPixels::on;
  const train::TrainReport on = train::train(o, mesh, log);
  if (mesh.rank() == 0) expect_same_run(on, off, 0.0, "--prefetch-pixels on " + mesh.shape().str());
  const int64_t next = on.memory_estimate.next_pixels;
  EXPECT_GT(next, 0) << "the next step's pixels are not in the estimate";
  // The run's largest estimate (over its steps) grows, by at most one step's prefetch.
  EXPECT_GT(on.memory_estimate.total(), off.memory_estimate.total());
  EXPECT_LE(on.memory_estimate.total() - next, off.memory_estimate.total());
  // What the prefetch adds to a step's measured peak is within what the estimate adds.
  ASSERT_EQ(on.steps.size(), off.steps.size());
  for (size_t i = 0; i < on.steps.size(); ++i)
    EXPECT_LE(on.steps[i].peak_bytes - off.steps[i].peak_bytes, next)
        << "step " << on.steps[i].step << ": peak " << on.steps[i].peak_bytes << " with the prefetch, "
        << off.steps[i].peak_bytes << " without";
  // Under a limit that the largest step fits only without its prefetched pixels: nothing
  // refused, the step over the limit with them loads the next step's pixels itself.
  o.memory.limit_bytes = off.memory_estimate.total();
  o.memory.limit_source = "test";
  const train::TrainReport tight = train::train(o, mesh, log);
  EXPECT_LE(tight.memory_estimate.total(), o.memory.limit_bytes);
  if (mesh.rank() == 0) expect_same_run(tight, off, 0.0, "--prefetch-pixels on, under a tight limit");
}

// Long video under SP (docs/train.md): one video of 128 frames at 448 x 448 (grid [64, 32, 32]:
// 65,536 patches, 16,384 placeholder rows) in a sample of 16,410 tokens, beside short samples
// with small images, on ring 2 x Ulysses 2 with the tower split over the context group
// (--vision-split auto): two steps train the model one process trains (fp64, rtol 1e-9),
// Qwen2.5-VL under --shard parameters with --checkpoint-activations all. Its tower attends
// within windows, some layers within whole frames.
// The frames are examples/data's circle.png, resized by the grid as the video processors do.
// The one-process references run last, on rank 0 alone: each takes longer than the mesh's
// 60 s rendezvous would wait.
TEST(LongVideo, SplitOverTheContextGroupTrainsTheModelOneProcessTrains) {
  const int world = test::rank_env().world_size;
  if (world != 4) GTEST_SKIP() << "ring 2 x Ulysses 2 only";
  const bool checker = test::rank_env().rank == 0;
  std::ostringstream log;
  const int64_t t = 64, h = 32, w = 32, m = 2;
  const int64_t per_rank = 4224;  // a step of 16,896 slots: the video's sample and short ones
  auto options = [&](const std::string& config_path, const std::string& data, int64_t tokens_per_rank) {
    train::TrainOptions o = tiny_options(tokens_per_rank);
    o.inputs.model = config_path;
    o.inputs.data = data;
    o.schedule.steps = 2;
    o.parallel.attention_block = 256;
    return o;
  };
  struct Run {
    std::string file, config_path, data, what;
    train::TrainReport got;
  };
  std::vector<Run> runs;
  const dist::Mesh mesh = test::make_mesh(plan::Mesh{1, 2, 2});
  using AC = model::ActivationCheckpointing;
  // Qwen2.5-VL only (its windowed tower; CI's time: 595 s with Qwen2-VL's two runs and
  // reference too, 2026-12-02): model.qwen_vl.multirank.* split every Qwen tower at test size.
  for (const char* file : {"tiny-qwen2_5-vl.json"}) {
    const std::string config_path = small_vocab_config(file, false);
    {  // 4 vision heads: the tower splits over the 4 ranks only when they divide its heads
      std::ifstream in(config_path);
      nlohmann::json config = nlohmann::json::parse(in);
      config["vision_config"]["num_heads"] = 4;
      std::ofstream(config_path) << config.dump(2);
    }
    const std::string data = test::scratch_dir("long-video-") + "/data.jsonl";  // per rank
    {
      std::ofstream out(data);
      const std::string circle = std::string(MMSP_SOURCE_DIR) + "/examples/data/circle.png";
      for (int line = 0; line < 6; ++line) {
        nlohmann::json sample;
        std::vector<int64_t> ids = {1};
        if (line == 0) {  // the long video
          ids.push_back(120);
          ids.insert(ids.end(), t * h * w / (m * m), 124);
          ids.push_back(121);
          sample["videos"] = {{{"frames", std::vector<std::string>(2 * t, circle)}}};
          sample["video_grid_thw"] = {{t, h, w}};
        } else if (line % 2 == 1) {  // a small image, whole on one rank (Vision DP)
          ids.insert(ids.end(), {120, 123, 121});
          sample["images"] = {{{"path", circle}}};
          sample["image_grid_thw"] = {{1, 2, 2}};
        }
        for (int k = 0; k < 20 + 7 * line; ++k) ids.push_back(3 + (line * 13 + k * 5) % 110);
        ids.push_back(2);
        sample["input_ids"] = ids;
        out << sample.dump() << "\n";
      }
    }
    for (const auto& [level, mode] : {std::pair<const char*, AC>{"parameters", AC::all}}) {
      train::TrainOptions o = options(config_path, data, per_rank);
      o.parallel.shard = parallel::parse_shard_level(level);
      o.memory.checkpoint_activations = mode;
      o.parallel.vision_split = plan::parse_vision_split("auto");
      runs.push_back({file, config_path, data,
                      std::string(file) + " long video --shard " + level + " " + model::to_string(mode),
                      train::train(o, mesh, log)});
    }
  }
  if (checker) {
    std::map<std::string, train::TrainReport> refs;
    for (const Run& r : runs) {
      if (!refs.count(r.file)) {
        refs[r.file] = train::train(options(r.config_path, r.data, per_rank * world), dist::Mesh::solo(), log);
        ASSERT_GE(refs[r.file].steps[0].tokens, 16410) << "the long video's sample trains in the first step";
      }
      expect_same_run(r.got, refs[r.file], 1e-9, r.what);
    }
  }
  for (const Run& r : runs) {
    std::filesystem::remove(r.config_path);
    std::filesystem::remove(r.data);
  }
}

}  // namespace
}  // namespace mmsp

// ---- Fine-tuning (issue 71): frozen parts, accumulation, evaluation (suite Finetune:
// train.finetune.multirank.npN). Rank 0 runs the one-process references and compares.
namespace mmsp {
namespace {

// Text lines of the small vocabulary, every fourth with one image of `image` placeholder
// tokens (the family's; grid given or the family's own), lengths 22..50 unless `length`
// fixes them all; `offset` draws other token ids (a held-out set).
void write_image_data(const std::string& path, const std::vector<int64_t>& image, const nlohmann::json& grid, int lines,
                      int64_t length = 0, int offset = 0) {
  std::ofstream out(path);
  for (int line = 0; line < lines; ++line) {
    nlohmann::json sample;
    std::vector<int64_t> ids = {1};
    const bool with_image = line % 4 == 1;
    if (with_image) ids.insert(ids.end(), image.begin(), image.end());
    const int64_t words =
        length > 0 ? length - 2 - (with_image ? static_cast<int64_t>(image.size()) : 0) : 20 + 7 * (line % 5);
    for (int64_t k = 0; k < words; ++k) ids.push_back(3 + (line * 11 + k * 5 + offset) % 110);
    ids.push_back(2);
    sample["input_ids"] = ids;
    if (with_image) {
      sample["images"] = {{{"path", std::string(MMSP_SOURCE_DIR) + "/examples/data/circle.png"}}};
      if (!grid.is_null()) sample["image_grid_thw"] = grid;
    }
    out << sample.dump() << "\n";
  }
}

// `error` (test::error_of's) holds `words`; else the test fails showing it.
void expect_error(const std::string& error, const std::string& words) {
  EXPECT_NE(error.find(words), std::string::npos) << "the error: " << error << "\nlacks: " << words;
}

const std::vector<int64_t> kQwenImage = {120, 123, 121};  // one merged patch: grid [1, 2, 2]

// The parameters a run of `o` starts from, as build_trainable draws them.
std::map<std::string, at::Tensor> initial_parameters(const train::TrainOptions& o) {
  at::manual_seed(static_cast<int64_t>(o.inputs.seed));
  model::ParameterInitScope init(model::ParameterInit::random, o.inputs.dtype);
  const auto vlm = model::build_vlm(train::resolve_model(o.inputs.model).config);
  std::map<std::string, at::Tensor> out;
  for (const auto& item : vlm->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// Frozen parameters end as they began, bit for bit; at least one of the others moved.
void expect_frozen(const train::TrainReport& got, const std::map<std::string, at::Tensor>& initial,
                   const std::set<std::string>& frozen, const std::string& where) {
  ASSERT_FALSE(frozen.empty()) << where;
  int moved = 0;
  for (const auto& [name, p] : got.parameters) {
    const bool same = at::equal(p, initial.at(name));
    if (frozen.count(name))
      EXPECT_TRUE(same) << where << ": frozen " << name << " changed";
    else
      moved += same ? 0 : 1;
  }
  EXPECT_GT(moved, 0) << where << ": nothing trained";
}

// --freeze: for each family a part set its users freeze (LLaMA-Factory's default frozen
// tower; ms-swift's frozen LLM; a frozen token embedding, so the first decoder layer's
// input needs no gradient) trains the model one process trains with the same parts frozen
// (fp64, 1e-9) on the widest context mesh, each --shard level in two of the families (the
// CI's minutes), and Qwen2-VL on a data-parallel mesh under ZeRO-3 too; the frozen
// parameters do not move. On Qwen2-VL one process's state also shrinks by at least the
// frozen parameters' two AdamW moments, as the preflight's optimizer state does exactly.
TEST(Finetune, FrozenPartsTrainAsOneProcessWithThemFrozen) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  struct FreezeCase {
    FamilyCase family;
    const char* freeze;
    std::vector<const char*> levels;  // --shard levels on the widest context mesh
    bool data_parallel = false;       // and --shard parameters on dp = world
  };
  const std::vector<FreezeCase> cases = {
      {{"tiny-qwen2-vl.json", true, 4}, "vision,merger", {"none", "optimizer"}, true},
      {{"tiny-qwen3-vl.json", false, 4}, "vision", {"gradients", "parameters"}},
      {{"tiny-llava.json", false, 4}, "llm,embeddings", {"none", "parameters"}},
      {{"tiny-qwen3_5-vl.json", false, 2}, "vision,embeddings", {"optimizer", "gradients"}},
      {{"tiny-internvl.json", false, 4, 192}, "merger,llm", {"none", "parameters"}}};
  std::ostringstream log;
  for (const FreezeCase& c : cases) {
    const int64_t per_rank = c.family.per_rank;
    const std::string config_path = small_vocab_config(c.family.file, c.family.tie);
    const auto parts = model::parse_model_parts(c.freeze);
    plan::Mesh widest = context_shape(world);
    if (widest.ulysses > c.family.max_ulysses || widest.ulysses == 3) widest = {1, world, 1};
    std::vector<plan::Mesh> shapes = {widest};
    if (c.data_parallel && world > 1) shapes.push_back({world, 1, 1});
    for (const plan::Mesh& shape : shapes) {
      train::TrainReport ref;
      std::map<std::string, at::Tensor> initial;
      std::set<std::string> frozen;
      if (checker) {
        train::TrainOptions o = tiny_options(per_rank * world);
        o.inputs.model = config_path;
        o.inputs.data_rows = shape.dp;
        o.finetune.freeze = parts;
        ref = train::train(o, dist::Mesh::solo(), log);
        initial = initial_parameters(o);
        const auto vlm = model::build_vlm(train::resolve_model(config_path).config);
        const model::NamedParams params = model::named_parameters(*vlm);
        const auto part_of = model::parameter_parts(*vlm, params);
        for (size_t i = 0; i < params.size(); ++i)
          if (std::find(parts.begin(), parts.end(), part_of[i]) != parts.end()) frozen.insert(params[i].first);
        expect_frozen(ref, initial, frozen, std::string(c.family.file) + " one process");
        if (c.data_parallel && shape.dp == 1) {
          o.finetune.freeze.clear();
          const train::TrainReport all = train::train(o, dist::Mesh::solo(), log);
          int64_t frozen_elements = 0;
          for (const auto& name : frozen) frozen_elements += initial.at(name).numel();
          EXPECT_GE(all.state_bytes - ref.state_bytes, 2 * 8 * frozen_elements) << "AdamW moments of frozen weights";
          EXPECT_EQ(all.memory_estimate.optimizer - ref.memory_estimate.optimizer, 2 * 8 * frozen_elements);
        }
      }
      const dist::Mesh mesh = test::make_mesh(shape);
      const std::vector<const char*> levels = shape.dp == 1 ? c.levels : std::vector<const char*>{"parameters"};
      for (const char* level : levels) {
        train::TrainOptions o = tiny_options(per_rank);
        o.inputs.model = config_path;
        o.finetune.freeze = parts;
        o.parallel.shard = parallel::parse_shard_level(level);
        if (std::string(level) == "parameters") o.memory.checkpoint_activations = model::ActivationCheckpointing::all;
        const train::TrainReport got = train::train(o, mesh, log);
        const std::string where =
            std::string(c.family.file) + " --freeze " + c.freeze + " --shard " + level + " " + shape.str();
        if (checker) {
          expect_same_run(got, ref, 1e-9, where);
          expect_frozen(got, initial, frozen, where);
        }
      }
    }
    std::filesystem::remove(config_path);
  }
}

// A run with frozen parts stopped after step 2 and resumed equals an uninterrupted one bit
// for bit, with every weight replicated (the frozen ones read back from the checkpoint beside
// the trained ones' AdamW state) and with ZeRO-1 (the frozen ones outside the shards).
TEST(Finetune, FrozenPartsResumeBitForBit) {
  const dist::Mesh mesh = test::make_mesh(context_shape(test::rank_env().world_size).ulysses == 3
                                              ? plan::Mesh{1, test::rank_env().world_size, 1}
                                              : context_shape(test::rank_env().world_size));
  for (const char* level : {"none", "optimizer"}) {
    train::TrainOptions o = tiny_options(96);
    o.finetune.freeze = model::parse_model_parts("vision,embeddings");
    o.parallel.shard = parallel::parse_shard_level(level);
    expect_stop_and_resume_exact(o, mesh, std::string("freeze-") + level);
  }
}

// --accumulate 2: on every kind of mesh (context, data parallel) and under ZeRO-2 (whose
// hooks reduce each micro-step's gradients as its backward ends, adding to the shards)
// the run equals one process accumulating alike (fp64, 1e-9); and one process's two
// micro-batches of one row equal one step of both as two rows (samples of one length, so
// that the union is the same samples: token-weighted, as one big step).
TEST(Finetune, AccumulatedMicroStepsEqualOneProcessOnTheirUnion) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  const int64_t per_rank = 96;
  std::ostringstream log;
  for (const plan::Mesh& shape : {context_shape(world), plan::Mesh{world, 1, 1}}) {
    if (shape.ulysses == 3) continue;  // 2 K/V heads cannot be split 3 ways
    train::TrainReport ref;
    if (checker) {
      train::TrainOptions one = tiny_options(per_rank * world);
      one.inputs.data_rows = shape.dp;
      one.schedule.accumulate = 2;
      ref = train::train(one, dist::Mesh::solo(), log);
    }
    const dist::Mesh mesh = test::make_mesh(shape);
    for (const char* level : {"none", "gradients"}) {
      train::TrainOptions o = tiny_options(per_rank);
      o.schedule.accumulate = 2;
      o.parallel.shard = parallel::parse_shard_level(level);
      const train::TrainReport got = train::train(o, mesh, log);
      if (checker) expect_same_run(got, ref, 1e-9, std::string("--accumulate 2 --shard ") + level + " " + shape.str());
    }
  }
  if (!checker) return;
  const std::string config_path = small_vocab_config("tiny-qwen2-vl.json", true);
  const std::string data = test::scratch_dir("accumulate-") + "/data.jsonl";
  write_image_data(data, kQwenImage, {{1, 2, 2}}, 12, 40);
  train::TrainOptions micro = tiny_options(40);
  micro.inputs.model = config_path;
  micro.inputs.data = data;
  micro.schedule.accumulate = 2;
  train::TrainOptions whole = micro;
  whole.schedule.accumulate = 1;
  whole.inputs.tokens_per_rank = 80;
  whole.inputs.data_rows = 2;
  const train::TrainReport a = train::train(micro, dist::Mesh::solo(), log),
                           b = train::train(whole, dist::Mesh::solo(), log);
  expect_same_run(a, b, 1e-9, "two micro-batches against their union");
  std::filesystem::remove(config_path);
  std::filesystem::remove(data);
}

// --eval-data, --eval-every 2 over 3 steps: the held-out loss after steps 2 and 3, over the
// whole file, equals one process's (fp64, 1e-9) on the widest context mesh unsharded and
// under ZeRO-3 (its weights gathered for a forward without gradients), and changes as the
// model trains; the training itself is unchanged by it.
TEST(Finetune, EvaluationEqualsOneProcess) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  std::ostringstream log;
  const std::string config_path = small_vocab_config("tiny-qwen2-vl.json", true);
  const std::string dir = test::scratch_dir("eval-");  // per rank
  write_image_data(dir + "/train.jsonl", kQwenImage, {{1, 2, 2}}, 12);
  write_image_data(dir + "/eval.jsonl", kQwenImage, {{1, 2, 2}}, 7, 0, 37);
  auto options = [&](int64_t per_rank) {
    train::TrainOptions o = tiny_options(per_rank);
    o.inputs.model = config_path;
    o.inputs.data = dir + "/train.jsonl";
    o.eval.data = dir + "/eval.jsonl";
    o.eval.every = 2;
    return o;
  };
  train::TrainReport ref;
  if (checker) {
    ref = train::train(options(64 * world), dist::Mesh::solo(), log);
    ASSERT_EQ(ref.evals.size(), 2u);
    EXPECT_EQ(ref.evals[0].step, 2);
    EXPECT_EQ(ref.evals[1].step, 3);
    EXPECT_GT(ref.evals[0].label_tokens, 7 * 20);
    EXPECT_NE(ref.evals[0].loss, ref.evals[1].loss);
    train::TrainOptions plain = options(64 * world);
    plain.eval.data.clear();
    plain.eval.every = 0;
    expect_same_run(ref, train::train(plain, dist::Mesh::solo(), log), 0, "evaluation leaves training alone");
  }
  plan::Mesh shape = context_shape(world);
  if (shape.ulysses == 3) shape = {1, world, 1};
  const dist::Mesh mesh = test::make_mesh(shape);
  for (const char* level : {"none", "parameters"}) {
    train::TrainOptions o = options(64);
    o.parallel.shard = parallel::parse_shard_level(level);
    const train::TrainReport got = train::train(o, mesh, log);
    if (!checker) continue;
    const std::string where = std::string("--eval-data --shard ") + level + " " + shape.str();
    expect_same_run(got, ref, 1e-9, where);
    ASSERT_EQ(got.evals.size(), ref.evals.size()) << where;
    for (size_t i = 0; i < ref.evals.size(); ++i) {
      EXPECT_EQ(got.evals[i].label_tokens, ref.evals[i].label_tokens) << where;
      EXPECT_NEAR(got.evals[i].loss, ref.evals[i].loss, 1e-9 * ref.evals[i].loss) << where << " eval " << i;
    }
  }
  std::filesystem::remove(config_path);
  std::filesystem::remove_all(dir);
}

// LoRA (--lora-rank 4 --lora-alpha 8, the decoder's seven projections) on the built-in
// Qwen2-VL-architecture model: every base weight stays as drawn, the adapters train, and the
// run equals one process's on the widest context mesh unsharded, under ZeRO-3 with recomputed
// layers and tiled MLPs (the MLP's maps read as W + scale · B A), and on a data-parallel mesh
// (fp64, 1e-9). Then, on the widest mesh under ZeRO-3 (the base sharded too), a run stopped
// and resumed equals an uninterrupted one bit for bit, and its checkpoint holds peft's adapter
// (transformers' names, rank, alpha) and a merged hf/ (W + scale · B A of master/'s exact tensors).
TEST(Finetune, LoraTrainsAsOneProcessAndWritesPeftAdapters) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  const int64_t per_rank = 96;
  std::ostringstream log;
  auto lora = [](train::TrainOptions o) {
    o.finetune.lora.rank = 4;
    o.finetune.lora.alpha = 8;
    return o;
  };
  std::vector<plan::Mesh> shapes = {context_shape(world)};
  if (world > 1) shapes.push_back({world, 1, 1});
  for (const plan::Mesh& shape : shapes) {
    if (shape.ulysses == 3) continue;  // 2 K/V heads cannot be split 3 ways
    train::TrainReport ref;
    std::map<std::string, at::Tensor> initial;
    if (checker) {
      train::TrainOptions one = lora(tiny_options(per_rank * world));
      one.inputs.data_rows = shape.dp;
      ref = train::train(one, dist::Mesh::solo(), log);
      initial = initial_parameters(one);
      std::set<std::string> frozen;
      for (const auto& [name, p] : ref.parameters)
        if (!model::is_lora_parameter(name)) frozen.insert(name);
      EXPECT_EQ(ref.parameters.size() - frozen.size(), 3u * 7 * 2) << "three layers' seven maps, A and B each";
      for (auto& [name, p] : ref.parameters)  // initial_parameters has no adapters
        if (model::is_lora_parameter(name)) initial[name] = at::zeros_like(p);
      expect_frozen(ref, initial, frozen, "--lora-rank 4 one process");
    }
    const dist::Mesh mesh = test::make_mesh(shape);
    for (const char* level : {"none", "parameters"}) {
      if (shape.dp != 1 && std::string(level) == "none") continue;
      train::TrainOptions o = lora(tiny_options(per_rank));
      o.parallel.shard = parallel::parse_shard_level(level);
      if (std::string(level) == "parameters" && shape.dp == 1) {
        o.memory.checkpoint_activations = model::ActivationCheckpointing::all;
        o.memory.tiled_mlp = 5;
      }
      const train::TrainReport got = train::train(o, mesh, log);
      if (checker) expect_same_run(got, ref, 1e-9, std::string("--lora-rank 4 --shard ") + level + " " + shape.str());
    }
  }
  // Resumed under ZeRO-3, whose frozen base weights are sharded too: the checkpoint writes
  // them whole and the resume refills their shards.
  train::TrainOptions o = lora(tiny_options(per_rank));
  o.parallel.shard = parallel::parse_shard_level("parameters");
  const dist::Mesh mesh =
      test::make_mesh(context_shape(world).ulysses == 3 ? plan::Mesh{1, world, 1} : context_shape(world));
  expect_stop_and_resume_exact(o, mesh, "lora", [&](const std::string& dir) {
    if (!checker) return;
    const std::string step = dir + "/step-000002";
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(step + "/adapter/adapter_config.json"));
    EXPECT_EQ(config.at("peft_type"), "LORA");
    EXPECT_EQ(config.at("r"), 4);
    EXPECT_EQ(config.at("lora_alpha"), 8.0);
    const auto adapter = hf::load_safetensors(step + "/adapter/adapter_model.safetensors");
    EXPECT_EQ(adapter.size(), 3u * 7 * 2);
    const std::string q = "base_model.model.model.language_model.layers.0.self_attn.q_proj";
    ASSERT_TRUE(adapter.count(q + ".lora_A.weight")) << "peft's names, transformers' module path";
    const hf::HfDirectory master = hf::open_hf_directory(step + "/master"),
                          merged = hf::open_hf_directory(step + "/hf");
    EXPECT_FALSE(merged.tensors.count("model.layers.0.self_attn.q_proj.lora_A.weight")) << "hf/ is merged";
    auto read = [](const hf::HfDirectory& d, const std::string& name) {
      const std::vector<int64_t>& shape = d.tensors.at(name).entry.shape;
      int64_t n = 1;
      for (int64_t extent : shape) n *= extent;
      return hf::read_hf_elements(d, name, 0, n).view(shape);
    };
    const std::string m = "model.layers.0.self_attn.q_proj";
    const at::Tensor A = read(master, m + ".lora_A.weight"), B = read(master, m + ".lora_B.weight");
    EXPECT_TRUE(at::equal(adapter.at(q + ".lora_A.weight"), A)) << "the adapter is master/'s";
    EXPECT_GT(B.abs().max().item<double>(), 0) << "lora_B trained";
    const at::Tensor want = read(master, m + ".weight") + at::matmul(B, A) * 2.0;  // alpha 8 / rank 4
    EXPECT_LE((read(merged, m + ".weight") - want).abs().max().item<double>(), 1e-15);
  });
}

// LoRA in bf16 (fp32 masters of the adapters only) under ZeRO-2 on the widest context mesh:
// the losses follow one process's in bf16 (rtol 2e-2: bf16's sums run in another order over
// the ranks), every base weight stays as drawn, bit for bit, and the adapters' lora_B move.
TEST(Finetune, LoraTrainsInBfloat16) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  std::ostringstream log;
  auto options = [](int64_t per_rank) {
    train::TrainOptions o = tiny_options(per_rank);
    o.inputs.dtype = train::parse_compute_dtype("bfloat16");
    o.finetune.lora.rank = 4;
    o.finetune.lora.alpha = 8;
    return o;
  };
  train::TrainReport ref;
  if (checker) ref = train::train(options(96 * world), dist::Mesh::solo(), log);
  const plan::Mesh shape = context_shape(world).ulysses == 3 ? plan::Mesh{1, world, 1} : context_shape(world);
  train::TrainOptions o = options(96);
  o.parallel.shard = parallel::parse_shard_level("gradients");
  const train::TrainReport got = train::train(o, test::make_mesh(shape), log);
  if (!checker) return;
  const std::string where = "--lora-rank 4 --dtype bfloat16 --shard gradients " + shape.str();
  ASSERT_EQ(got.steps.size(), ref.steps.size()) << where;
  for (size_t i = 0; i < ref.steps.size(); ++i)
    EXPECT_NEAR(got.steps[i].loss, ref.steps[i].loss, 2e-2 * ref.steps[i].loss) << where << " step " << i + 1;
  const std::map<std::string, at::Tensor> initial = initial_parameters(o);
  int adapters = 0;
  for (const auto& [name, p] : got.parameters) {
    EXPECT_EQ(p.scalar_type(), at::kBFloat16) << where << " " << name;
    if (!model::is_lora_parameter(name)) {
      EXPECT_TRUE(at::equal(p, initial.at(name))) << where << ": frozen " << name << " changed";
    } else if (name.find("lora_B") != std::string::npos) {
      EXPECT_GT(p.abs().max().item<double>(), 0) << where << ": " << name << " did not train";
      ++adapters;
    }
  }
  EXPECT_EQ(adapters, 3 * 7) << where;
}

// A rollouts file (docs/rl.md) for the small-vocabulary Qwen2-VL config, as an RL loop
// makes one: prompts with images (loss_mask 0) and responses, the old policy's
// log-probabilities from `mmsp logprobs` (train::write_logprobs, one process) moved by up to
// ±0.35 so that some ratios leave [0.8, 1.2] (the clip and the dual clip act), every fourth
// line on-policy (no old_logprobs), reference log-probabilities beside them, and advantages
// per sequence on every third line, per token on the others. And its lines as DPO pairs
// (lines 2p and 2p + 1 chosen and rejected), the reference's sums the policy's moved by up
// to ±1.5 (every pair's h off 0), in `pairs`.
std::string write_rollouts(const std::string& dir, const std::string& config_path, std::string* pairs = nullptr,
                           const std::vector<int64_t>& image = kQwenImage,
                           const nlohmann::json& grid = nlohmann::json::array({{1, 2, 2}})) {
  const std::string base = dir + "/base.jsonl", rollouts = dir + "/rollouts.jsonl";
  write_image_data(base, image, grid, 12);
  std::vector<nlohmann::json> lines;
  {
    std::ifstream in(base);
    for (std::string text; std::getline(in, text);) lines.push_back(nlohmann::json::parse(text));
  }
  {
    std::ofstream out(base);
    for (nlohmann::json& line : lines) {
      const size_t n = line["input_ids"].size();
      std::vector<int64_t> mask(n, 1);
      std::fill(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(2 * n / 5), 0);  // the prompt
      line["loss_mask"] = mask;
      out << line.dump() << "\n";
    }
  }
  train::TrainOptions o = tiny_options(128);
  o.inputs.model = config_path;
  o.inputs.data = base;
  o.inputs.shuffle = false;
  train::LogprobsOptions l;
  l.out = dir + "/old.jsonl";
  std::ostringstream log;
  train::write_logprobs(o, l, dist::Mesh::solo(), log);
  std::ifstream old(l.out);
  std::ofstream out(rollouts);
  nlohmann::json pair;
  std::ofstream pair_out(pairs ? * pairs = dir + "/pairs.jsonl" : std::string("/dev/null"));
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string text;
    std::getline(old, text);
    const auto lp = nlohmann::json::parse(text)["logprobs"].get<std::vector<double>>();
    double sum = 0;
    for (const double x : lp) sum += x;
    const char* side = i % 2 == 0 ? "chosen" : "rejected";
    pair[side] = lines[i];
    pair[std::string("ref_") + side + "_logps"] = sum - 1.5 * std::sin(2.1 * static_cast<double>(i));
    if (i % 2 == 1) pair_out << pair.dump() << "\n";
    std::vector<double> moved, ref, advantages;
    for (size_t k = 0; k < lp.size(); ++k) {
      moved.push_back(lp[k] + 0.35 * std::sin(1.7 * static_cast<double>(i + 3 * k)));
      ref.push_back(std::min(0.0, lp[k] - 0.25 * std::cos(0.9 * static_cast<double>(2 * i + k))));
      advantages.push_back(std::sin(0.7 * static_cast<double>(5 * i + k)));
    }
    nlohmann::json& line = lines[i];
    if (i % 3 == 0)
      line["advantages"] = std::cos(1.3 * static_cast<double>(i));
    else
      line["advantages"] = advantages;
    if (i % 4 != 3) line["old_logprobs"] = moved;
    line["ref_logprobs"] = ref;
    out << line.dump() << "\n";
  }
  return rollouts;
}

// --objective grpo / ppo / dpo (issue 72): each mode of verl's loss aggregation, every KL
// estimator, the clip and the dual clip, PPO's entropy bonus (through the row-sharded head
// and the whole one), and DPO (with and without label smoothing) train
// the model one process trains (fp64, 1e-9): GRPO (seq-mean-token-mean, k3) on the widest
// context mesh, PPO (token-mean, dual clip, k1) and DPO there under ZeRO-3 with recomputed
// layers (the row-sharded head), Dr. GRPO (seq-mean-token-sum-norm, k2), seq-mean-token-sum
// and cDPO on a data-parallel mesh with --accumulate 2 (the weights and pairs over the
// step's micro-batches); and an objective moves the model elsewhere than the cross-entropy.
TEST(Finetune, PolicyObjectivesTrainAsOneProcess) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  std::ostringstream log;
  const std::string config_path = small_vocab_config("tiny-qwen2-vl.json", true);
  const std::string dir = test::scratch_dir("rollouts-");  // per rank
  std::string pairs;
  const std::string rollouts = write_rollouts(dir, config_path, &pairs);
  struct Case {
    const char* what;
    train::Objective kind;
    train::LossAgg agg;
    train::KlKind kl;
    bool data_parallel;
    const char* shard;
  };
  const std::vector<Case> cases = {
      {"grpo", train::Objective::grpo, train::LossAgg::seq_mean_token_mean, train::KlKind::k3, false, "none"},
      {"ppo", train::Objective::ppo, train::LossAgg::token_mean, train::KlKind::k1, false, "parameters"},
      {"dr-grpo", train::Objective::grpo, train::LossAgg::seq_mean_token_sum_norm, train::KlKind::k2, true, "none"},
      {"seq-sum", train::Objective::ppo, train::LossAgg::seq_mean_token_sum, train::KlKind::k3, true, "gradients"},
      {"dpo", train::Objective::dpo, {}, {}, false, "parameters"},
      {"dpo", train::Objective::dpo, {}, {}, true, "none"}};
  plan::Mesh widest = context_shape(world);
  if (widest.ulysses == 3) widest = {1, world, 1};
  for (const Case& c : cases) {
    const plan::Mesh shape = c.data_parallel ? plan::Mesh{world, 1, 1} : widest;
    auto options = [&](int64_t per_rank) {
      train::TrainOptions o = tiny_options(per_rank);
      o.inputs.model = config_path;
      o.inputs.data = c.kind == train::Objective::dpo ? pairs : rollouts;
      o.objective = train::objective_defaults(c.kind);
      if (c.kind == train::Objective::dpo) {
        o.objective.beta = 0.2;
        o.objective.label_smoothing = c.data_parallel ? 0.1 : 0;
      } else {
        o.objective.agg = c.agg;
        o.objective.kl = c.kl;
        o.objective.kl_coef = 0.1;
        o.objective.temperature = 0.8;
        // the entropy bonus through the row-sharded head (ZeRO-3) and the whole one
        if (c.kind == train::Objective::ppo) o.objective.entropy_coef = 0.05;
      }
      if (c.agg == train::LossAgg::seq_mean_token_sum_norm) o.objective.loss_scale = 40;
      if (c.data_parallel) o.schedule.accumulate = 2;
      return o;
    };
    const int64_t per_rank = c.kind == train::Objective::dpo ? 112 : 64;  // a pair fits one rank's row
    train::TrainReport ref;
    if (checker) {
      train::TrainOptions one = options(per_rank * world);
      one.inputs.data_rows = shape.dp;
      ref = train::train(one, dist::Mesh::solo(), log);
      if (c.kind == train::Objective::grpo && !c.data_parallel) {
        one.objective = {};
        const train::TrainReport ce = train::train(one, dist::Mesh::solo(), log);
        EXPECT_FALSE(at::allclose(ce.parameters.back().second, ref.parameters.back().second))
            << "GRPO trained the model as the cross-entropy does";
      }
    }
    train::TrainOptions o = options(per_rank);
    o.parallel.shard = parallel::parse_shard_level(c.shard);
    if (std::string(c.shard) == "parameters") o.memory.checkpoint_activations = model::ActivationCheckpointing::all;
    const train::TrainReport got = train::train(o, test::make_mesh(shape), log);
    if (!checker) continue;
    const std::string where = std::string(c.what) + " --shard " + c.shard + " " + shape.str();
    expect_same_run(got, ref, 1e-9, where);
    if (c.kind != train::Objective::dpo) {
      EXPECT_GT(ref.steps[0].objective.at("pg_clipfrac"), 0.05) << where << ": the clip never acts";
    }
    for (size_t i = 0; i < ref.steps.size(); ++i) {  // the logged figures (clip fraction, KL, DPO's rewards)
      const auto& want = ref.steps[i].objective;
      EXPECT_EQ(want.size(), c.kind == train::Objective::dpo ? 4u : c.kind == train::Objective::ppo ? 4u : 3u) << where;
      ASSERT_EQ(got.steps[i].objective.size(), want.size()) << where;
      for (const auto& [name, value] : want)
        EXPECT_NEAR(got.steps[i].objective.at(name), value, 1e-9 * std::max(std::abs(value), 1e-3))
            << where << " step " << i + 1 << " " << name;
    }
  }
  std::filesystem::remove(config_path);
  std::filesystem::remove_all(dir);
}

// Every other family through one objective each, the three in turn (their towers, deepstack,
// Gated DeltaNet, LLaVA's and InternVL's placeholders), on the widest context mesh under
// ZeRO-2: the run equals one process's (fp64, 1e-9).
TEST(Finetune, PolicyObjectivesTrainEveryFamilyAsOneProcess) {
  const int world = test::rank_env().world_size;
  const bool checker = test::rank_env().rank == 0;
  std::ostringstream log;
  struct Case {
    FamilyCase family;
    std::vector<int64_t> image;
    nlohmann::json grid;
    train::Objective kind;
  };
  const std::vector<int64_t> internvl = {120, 123, 123, 123, 123, 121};
  const std::vector<Case> cases = {
      {{"tiny-qwen2_5-vl.json", false, 4}, kQwenImage, {{1, 2, 2}}, train::Objective::ppo},
      {{"tiny-qwen3-vl.json", false, 4}, kQwenImage, {{1, 2, 2}}, train::Objective::dpo},
      {{"tiny-qwen3_5-vl.json", false, 2}, kQwenImage, {{1, 2, 2}}, train::Objective::grpo},
      {{"tiny-llava.json", false, 4}, std::vector<int64_t>(16, 123), nullptr, train::Objective::dpo},
      {{"tiny-internvl.json", false, 4}, internvl, nullptr, train::Objective::grpo}};
  for (const Case& c : cases) {
    const std::string config_path = small_vocab_config(c.family.file, c.family.tie);
    const std::string dir = test::scratch_dir("rollouts-family-");  // per rank
    std::string pairs;
    const std::string rollouts = write_rollouts(dir, config_path, &pairs, c.image, c.grid);
    plan::Mesh shape = context_shape(world);
    if (shape.ulysses > c.family.max_ulysses || shape.ulysses == 3) shape = {1, world, 1};
    const bool dpo = c.kind == train::Objective::dpo;
    auto options = [&](int64_t per_rank) {
      train::TrainOptions o = tiny_options(per_rank);
      o.inputs.model = config_path;
      o.inputs.data = dpo ? pairs : rollouts;
      o.objective = train::objective_defaults(c.kind);
      if (!dpo) {
        o.objective.kl_coef = 0.1;
        o.objective.temperature = 0.8;
      }
      return o;
    };
    const int64_t per_rank = dpo ? 144 : 96;  // a pair, a sample with LLaVA's 16 placeholders
    train::TrainReport ref;
    if (checker) ref = train::train(options(per_rank * world), dist::Mesh::solo(), log);
    train::TrainOptions o = options(per_rank);
    o.parallel.shard = parallel::ShardLevel::gradients;
    const train::TrainReport got = train::train(o, test::make_mesh(shape), log);
    if (checker)
      expect_same_run(got, ref, 1e-9,
                      std::string(c.family.file) + " --objective " + to_string(c.kind) + " " + shape.str());
    std::filesystem::remove(config_path);
    std::filesystem::remove_all(dir);
  }
}

// Bad input ends the run before anything is allocated, on every rank alike, naming the
// value and the rule: every part frozen, --accumulate 0, --eval-every without a file, an
// eval file of another vocabulary, an unknown part; an RL objective's missing or bad fields
// (advantages, old and reference log-probabilities, DPO pairs), naming the line.
TEST(Finetune, BadInputIsRefusedBeforeAnyCollective) {
  std::ostringstream log;
  const dist::Mesh& solo = dist::Mesh::solo();
  train::TrainOptions o = tiny_options(96);
  o.finetune.freeze = model::parse_model_parts("vision,merger,llm,embeddings");
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "freezes every parameter");
  o = tiny_options(96);
  o.schedule.accumulate = 0;
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "--accumulate 0 must be ≥ 1");
  o = tiny_options(96);
  o.eval.every = 2;
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "--eval-every 2 needs --eval-data");
  const std::string dir = test::scratch_dir("eval-vocab-");
  {
    std::ofstream out(dir + "/eval.jsonl");
    out << R"({"input_ids": [1, 5, 151000, 2]})"
        << "\n";
  }
  o = tiny_options(96);
  o.eval.data = dir + "/eval.jsonl";
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "151000 is outside the model's vocabulary");
  std::filesystem::remove_all(dir);
  o = tiny_options(96);
  o.finetune.lora.rank = 4;
  o.finetune.lora.targets = {"q_proj", "qkv_proj"};
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "\"qkv_proj\" names no linear map");
  o.finetune.lora.targets = {};
  o.finetune.freeze = model::parse_model_parts("vision");
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "LoRA freezes every weight but its adapters");
  o = tiny_options(96);
  o.finetune.lora.rank = -1;
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "--lora-rank -1 must be ≥ 1");
  // --objective grpo / ppo: the rollout numbers every line needs, and their rules.
  const std::string rl = test::scratch_dir("rollout-errors-");
  auto rollouts = [&](const std::string& second) {
    std::ofstream(rl + "/r.jsonl") << R"({"input_ids": [1, 5, 6, 7, 2], "advantages": 0.5})"
                                   << "\n"
                                   << second << "\n";
    train::TrainOptions r = tiny_options(96);
    r.inputs.data = rl + "/r.jsonl";
    r.objective = train::objective_defaults(train::Objective::grpo);
    return r;
  };
  o = rollouts(R"({"input_ids": [1, 8, 9, 2]})");
  expect_error(test::error_of([&] { train::train(o, solo, log); }),
               "r.jsonl:2: advantages is missing: --objective grpo needs every sample's advantages");
  o = rollouts(R"({"input_ids": [1, 8, 9, 2], "advantages": [0.1, 0.2]})");
  expect_error(test::error_of([&] { train::train(o, solo, log); }),
               "r.jsonl:2: advantages has 2 values; the sample has 3 labelled tokens");
  o = rollouts(R"({"input_ids": [1, 8, 9, 2], "advantages": 1, "old_logprobs": [-1, 0.5, -2]})");
  expect_error(test::error_of([&] { train::train(o, solo, log); }),
               "r.jsonl:2: old_logprobs[1] is 0.5: a log-probability is at most 0");
  o = rollouts(R"({"input_ids": [1, 8, 9, 2], "advantages": 1})");
  o.objective.kl_coef = 0.1;
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "r.jsonl:1: ref_logprobs is missing: --kl-coef");
  o.objective.kl_coef = 0;
  o.objective.clip_c = 0.5;
  expect_error(test::error_of([&] { train::train(o, solo, log); }), "--clip-ratio-c 0.5 must be above 1");
  o = tiny_options(96);
  o.objective = train::objective_defaults(train::Objective::ppo);
  expect_error(test::error_of([&] { train::train(o, solo, log); }),
               "--objective ppo reads each sample's advantages from a .jsonl --data");
  // --objective dpo: pair lines, both sides, a reference for each; pairs refused elsewhere.
  auto pairs = [&](const std::string& line, train::Objective kind) {
    std::ofstream(rl + "/p.jsonl") << line << "\n";
    train::TrainOptions r = tiny_options(96);
    r.inputs.data = rl + "/p.jsonl";
    r.objective = train::objective_defaults(kind);
    return r;
  };
  const std::string side = R"({"input_ids": [1, 5, 6, 2], "loss_mask": [0, 0, 1, 1]})";
  o = pairs(R"({"chosen": )" + side + "}", train::Objective::dpo);
  expect_error(test::error_of([&] { train::train(o, solo, log); }),
               "p.jsonl:1: a preference pair needs rejected as a sample object");
  o = pairs(R"({"chosen": )" + side + R"(, "rejected": )" + side + R"(, "ref_chosen_logps": -3})",
            train::Objective::dpo);
  expect_error(test::error_of([&] { train::train(o, solo, log); }),
               "p.jsonl:1 rejected: the reference is missing: --objective dpo needs ref_rejected_logps");
  o = pairs(
      R"({"chosen": )" + side + R"(, "rejected": )" + side + R"(, "ref_chosen_logps": -3, "ref_rejected_logps": 2})",
      train::Objective::dpo);
  expect_error(test::error_of([&] { train::train(o, solo, log); }),
               "p.jsonl:1: ref_rejected_logps is 2: a sum of log-probabilities is at most 0");
  o = pairs(R"({"chosen": )" + side + R"(, "rejected": )" + side + "}", train::Objective::cross_entropy);
  expect_error(test::error_of([&] { train::train(o, solo, log); }),
               "p.jsonl:1 chosen: the file holds preference pairs (chosen, rejected): --objective dpo trains on them");
  std::filesystem::remove_all(rl);
  expect_error(test::error_of([] { model::parse_model_parts("vision,tower"); }),
               "\"tower\" is not a part of the model; the parts are vision, merger, llm and embeddings");
}

}  // namespace
}  // namespace mmsp
