// GPU tests (ctest label `gpu`): each skips, saying so, where this process sees no CUDA
// device, so CPU CI builds and runs this binary too. On a GPU they prove:
//  - the fused kernel (FlashAttention-2 varlen) = mmsp's blockwise kernel on packed
//    segments, zigzag shares and GQA (bf16 against the fp32 kernel on the same values);
//  - one process on the GPU = the same step on the CPU, every family (fp64 ≤ 1e-9 on the
//    loss and every gradient; bf16 on the GPU against fp32 on the CPU: loss within 1e-2);
//  - sequence parallelism on the GPU = one process (MultiRankGpu*, under mmsp-run with
//    MMSP_SHARE_GPU=1: ranks share the GPU, collectives staged through host memory over
//    Gloo — this covers every collective's call site, the device plumbing and the
//    numerics, not NCCL itself, which needs one GPU per rank: see docs/gpu.md).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include "mmsp/attention/kernel_choice.h"
#include "mmsp/attention/local_attention.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/rank_device.h"
#include "mmsp/hf/hf_directory.h"
#include "mmsp/train/trainer.h"
#include "multirank.h"

namespace mmsp {
namespace {

bool have_gpu() { return dist::device_facts().gpus > 0; }

#define MMSP_REQUIRE_GPU()                                                               \
  do {                                                                                   \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device in this process: a gpu test skips"; \
  } while (0)

const c10::Device kCuda(c10::kCUDA, 0);

// Segments of the given lengths packed one after another (no padding).
attention::TokenLayout packed(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> seg, ord;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int64_t i = 0; i < lengths[s]; ++i) seg.push_back(static_cast<int64_t>(s)), ord.push_back(i);
  return {at::tensor(seg, at::kLong), at::tensor(ord, at::kLong)};
}

// Zigzag share p of R of the layout: chunks p and 2R-1-p of every segment.
attention::TokenLayout zigzag_share(const std::vector<int64_t>& lengths, int R, int p) {
  std::vector<int64_t> seg, ord;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t chunk = lengths[s] / (2 * R);
    for (int64_t c : {int64_t(p), int64_t(2 * R - 1 - p)})
      for (int64_t i = 0; i < chunk; ++i) seg.push_back(static_cast<int64_t>(s)), ord.push_back(c * chunk + i);
  }
  return {at::tensor(seg, at::kLong), at::tensor(ord, at::kLong)};
}

double rel(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.cpu().to(at::kDouble), w = want.cpu().to(at::kDouble);
  const at::Tensor finite = w.isfinite();
  return ((g - w).masked_fill(finite.logical_not(), 0).abs().max() /
          (1 + w.masked_fill(finite.logical_not(), 0).abs().max()))
      .item<double>();
}

// bf16 inputs: the fused kernel rounds its output and P to bf16 once, the blockwise
// kernel (fp32 over the same bf16 values) does not; measured differences are ~4e-3.
constexpr double kBf16Out = 2e-2, kBf16Lse = 1e-2, kBf16Grad = 4e-2;

// `kernel` (a registry name, running `implementation`) on bf16 CUDA tensors against the
// blockwise kernel in fp32 on the CPU over the same values.
void expect_kernel_equals_blockwise(const char* kernel, const char* implementation, const attention::TokenLayout& ql,
                                    const attention::TokenLayout& kl, bool causal, int64_t heads, int64_t kv_heads,
                                    int64_t dim, const std::string& where) {
  at::manual_seed(7);
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(kCuda);
  at::Tensor q = at::randn({ql.size(), heads, dim}, bf16), k = at::randn({kl.size(), kv_heads, dim}, bf16),
             v = at::randn({kl.size(), kv_heads, dim}, bf16), dout = at::randn({ql.size(), heads, dim}, bf16);
  attention::AttentionOptions fused;
  fused.causal = causal;
  fused.kernel = attention::parse_attention_kernel(kernel);
  const attention::KernelPlanPtr plan = attention::plan_kernel(ql, kl, fused, kCuda);
  ASSERT_STREQ(attention::kernel_in_use(*plan, q), implementation) << where;
  const attention::PartialAttention got = attention::local_attention_forward(q, k, v, *plan);
  const attention::AttentionGrads gg = attention::local_attention_backward(dout, q, k, v, got.out, got.lse, *plan);

  attention::AttentionOptions blockwise = fused;
  blockwise.kernel = attention::parse_attention_kernel("blockwise");
  const at::Tensor qf = q.cpu().to(at::kFloat), kf = k.cpu().to(at::kFloat), vf = v.cpu().to(at::kFloat);
  const attention::KernelPlanPtr ref_plan = attention::plan_kernel(ql, kl, blockwise, at::kCPU);
  const attention::PartialAttention want = attention::local_attention_forward(qf, kf, vf, *ref_plan);
  const attention::AttentionGrads gw =
      attention::local_attention_backward(dout.cpu().to(at::kFloat), qf, kf, vf, want.out, want.lse, *ref_plan);
  EXPECT_LT(rel(got.out, want.out), kBf16Out) << where << " out";
  EXPECT_LT(rel(got.lse, want.lse), kBf16Lse) << where << " lse";
  EXPECT_LT(rel(gg.dq, gw.dq), kBf16Grad) << where << " dq";
  EXPECT_LT(rel(gg.dk, gw.dk), kBf16Grad) << where << " dk";
  EXPECT_LT(rel(gg.dv, gw.dv), kBf16Grad) << where << " dv";
}

void expect_fused_equals_blockwise(const attention::TokenLayout& ql, const attention::TokenLayout& kl, bool causal,
                                   int64_t heads, int64_t kv_heads, int64_t dim, const std::string& where) {
  expect_kernel_equals_blockwise("fused", "flash-varlen", ql, kl, causal, heads, kv_heads, dim, where);
}

TEST(GpuFusedAttention, FlashVarlenEqualsBlockwiseOnPackedSegmentsAndShares) {
  MMSP_REQUIRE_GPU();
  const std::vector<int64_t> lengths{512, 96, 1000, 8, 384};
  for (bool causal : {true, false}) {
    const attention::TokenLayout row = packed(lengths);
    expect_fused_equals_blockwise(row, row, causal, 16, 16, 128, std::string("packed causal ") + (causal ? "1" : "0"));
    expect_fused_equals_blockwise(row, row, causal, 16, 4, 64, std::string("packed GQA ") + (causal ? "1" : "0"));
  }
  // Ring steps: zigzag share 0 against every share (several calls merged by lse).
  const std::vector<int64_t> even{512, 128, 1024};
  for (int src = 0; src < 2; ++src)
    expect_fused_equals_blockwise(zigzag_share(even, 2, 0), zigzag_share(even, 2, src), true, 8, 2, 128,
                                  "zigzag share 0 against share " + std::to_string(src));
}

// cuDNN's packed-sequence attention (square causal pieces) on the same cases, and a query
// slice against a whole segment (a causal piece wider than tall: a full piece and a square one).
TEST(GpuCudnnAttention, CudnnVarlenEqualsBlockwiseOnPackedSegmentsAndShares) {
  MMSP_REQUIRE_GPU();
  std::string why;
  if (!attention::parse_attention_kernel("cudnn").pinned->serves(
          at::empty({1, 16, 128}, at::TensorOptions().dtype(at::kBFloat16).device(kCuda)), &why))
    GTEST_SKIP() << "cuDNN attention does not serve this GPU: " << why;
  const std::vector<int64_t> lengths{512, 96, 1000, 8, 384};
  for (bool causal : {true, false}) {
    const attention::TokenLayout row = packed(lengths);
    const std::string c = causal ? " causal" : " bidirectional";
    expect_kernel_equals_blockwise("cudnn", "cudnn-varlen", row, row, causal, 16, 16, 128, "packed" + c);
    expect_kernel_equals_blockwise("cudnn", "cudnn-varlen", row, row, causal, 16, 4, 64, "packed GQA" + c);
  }
  const std::vector<int64_t> even{512, 128, 1024};
  for (int src = 0; src < 2; ++src)
    expect_kernel_equals_blockwise("cudnn", "cudnn-varlen", zigzag_share(even, 2, 0), zigzag_share(even, 2, src), true,
                                   8, 2, 128, "zigzag share 0 against share " + std::to_string(src));
  const attention::TokenLayout whole = packed({1024});
  const attention::TokenLayout slice = whole.slice(256, 512);  // orders 256..767 against 0..1023
  expect_kernel_equals_blockwise("cudnn", "cudnn-varlen", slice, whole, true, 8, 8, 128, "a slice against its segment");
}

// auto's measured choice on this GPU: the kernel chosen passed its probe and every kernel
// that serves bf16 here was timed (the table is printed for the log).
TEST(GpuKernelChoice, TheChosenKernelPassedItsProbe) {
  MMSP_REQUIRE_GPU();
  attention::ChoiceInputs in;
  in.device = kCuda;
  const attention::KernelChoice c =
      attention::choose_kernel(attention::choice_key(at::kBFloat16, 16, 4, 128, 4096, true), in);
  std::cout << c.table_text();
  bool chosen_passed = false;
  for (const attention::CandidateRow& r : c.table)
    if (r.kernel == c.chosen->name()) chosen_passed = r.passed && r.seconds > 0;
  EXPECT_TRUE(chosen_passed) << c.table_text();
  EXPECT_STRNE(c.chosen->name(), "blockwise") << "a fused kernel should beat the blockwise one on a GPU:\n"
                                              << c.table_text();
}

TEST(GpuFusedAttention, Fp64OnCudaRunsTheBlockwiseKernelExactly) {
  MMSP_REQUIRE_GPU();
  const attention::TokenLayout row = packed({100, 37, 64});
  at::manual_seed(3);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor q = at::randn({row.size(), 4, 32}, f64), k = at::randn({row.size(), 2, 32}, f64),
             v = at::randn({row.size(), 2, 32}, f64);
  const attention::KernelPlanPtr plan = attention::plan_kernel(row, row, {}, kCuda);
  EXPECT_STREQ(attention::kernel_in_use(*plan, q.to(kCuda)), "blockwise");
  const at::Tensor got = attention::local_attention_forward(q.to(kCuda), k.to(kCuda), v.to(kCuda), *plan).out;
  const at::Tensor want = attention::local_attention_forward(q, k, v, row, row, {}).out;
  EXPECT_LT(rel(got, want), 1e-12);
}

// One step of `config` on `device` in `dtype`, its gradients written to `dir`.
train::TrainReport one_step(const std::string& config, const std::string& dtype, const c10::Device& device,
                            const std::string& dir, const dist::Mesh& mesh,
                            const std::function<void(train::TrainOptions&)>& more = nullptr) {
  train::TrainOptions o;
  o.inputs.model = std::string(MMSP_SOURCE_DIR) + "/configs/" + config;
  o.inputs.dtype = train::parse_compute_dtype(dtype);
  o.schedule.steps = 1;
  o.inputs.tokens_per_rank = 192 / mesh.world_size();
  o.parallel.attention_block = 32;
  o.output.quiet = true;
  o.parallel.device = device;
  o.output.save_gradients = dir;
  o.output.report_parameters = false;
  if (more) more(o);
  std::ostringstream log;
  return train::train(o, mesh, log);
}

std::map<std::string, at::Tensor> read_dir(const std::string& dir) {
  const hf::HfDirectory d = hf::open_hf_directory(dir);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : d.tensors) {
    int64_t n = 1;
    for (int64_t s : t.entry.shape) n *= s;
    out[name] = hf::read_hf_elements(d, name, 0, n).to(at::kDouble);
  }
  return out;
}

void expect_same_gradients(const std::string& got_dir, const std::string& want_dir, double rtol,
                           const std::string& where) {
  const auto got = read_dir(got_dir), want = read_dir(want_dir);
  ASSERT_EQ(got.size(), want.size()) << where;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << where << " " << name;
    const double scale = w.abs().max().item<double>();
    EXPECT_LE((got.at(name) - w).abs().max().item<double>(), rtol * (scale + 1e-12)) << where << " " << name;
  }
}

std::string scratch(const std::string& what) {
  const char* port = std::getenv("MASTER_PORT");
  return (std::filesystem::temp_directory_path() /
          ("mmsp-gpu-" + what + "-" + (port ? std::string(port) : std::to_string(::getpid()))))
      .string();
}

const char* kFamilies[] = {"tiny-qwen2-vl.json",   "tiny-qwen2_5-vl.json", "tiny-qwen3-vl.json",
                           "tiny-qwen3_5-vl.json", "tiny-llava.json",      "tiny-internvl.json"};

TEST(GpuTrain, OneProcessOnTheGpuEqualsTheCpuForEveryFamily) {
  MMSP_REQUIRE_GPU();
  for (const char* config : kFamilies) {
    const std::string cpu = scratch("cpu"), gpu = scratch("gpu");
    const train::TrainReport want = one_step(config, "float64", at::kCPU, cpu, dist::Mesh::solo());
    const train::TrainReport got = one_step(config, "float64", kCuda, gpu, dist::Mesh::solo());
    EXPECT_NEAR(got.steps[0].loss, want.steps[0].loss, 1e-9 * want.steps[0].loss) << config;
    expect_same_gradients(gpu, cpu, 1e-9, config);
    std::filesystem::remove_all(cpu);
    std::filesystem::remove_all(gpu);
    const train::TrainReport fp32 = one_step(config, "float32", at::kCPU, cpu, dist::Mesh::solo());
    const train::TrainReport bf16 = one_step(config, "bfloat16", kCuda, gpu, dist::Mesh::solo());
    EXPECT_NEAR(bf16.steps[0].loss, fp32.steps[0].loss, 1e-2 * fp32.steps[0].loss) << config << " bf16";
    EXPECT_GT(bf16.steps[0].peak_bytes, 0) << config << ": the CUDA allocator's peak";
    std::filesystem::remove_all(cpu);
    std::filesystem::remove_all(gpu);
  }
}

// The memory layers on CUDA: recomputed layers' inputs offloaded to pinned host memory on
// a side stream and back (the path the CPU suite runs only as a copy), MLPs in tiles of 7
// tokens: the gradients of the plain CPU run (fp64, 1e-9), for a dense and a hybrid decoder.
TEST(GpuTrain, OffloadedAndTiledLayersOnTheGpuEqualTheCpu) {
  MMSP_REQUIRE_GPU();
  for (const char* config : {"tiny-qwen2-vl.json", "tiny-qwen3_5-vl.json"}) {
    const std::string cpu = scratch("cpu-mem"), gpu = scratch("gpu-mem");
    const train::TrainReport want = one_step(config, "float64", at::kCPU, cpu, dist::Mesh::solo());
    const train::TrainReport got =
        one_step(config, "float64", kCuda, gpu, dist::Mesh::solo(), [](train::TrainOptions& o) {
          o.memory.checkpoint_activations = model::ActivationCheckpointing::all;
          o.memory.offload_activations = true;
          o.memory.tiled_mlp = 7;
        });
    EXPECT_NEAR(got.steps[0].loss, want.steps[0].loss, 1e-9 * want.steps[0].loss) << config;
    expect_same_gradients(gpu, cpu, 1e-9, config);
    std::filesystem::remove_all(cpu);
    std::filesystem::remove_all(gpu);
  }
}

// Under mmsp-run -n 2|4 with MMSP_SHARE_GPU=1: every mesh on the one GPU against one process
// on it (fp64, 1e-9), for a plain and a hybrid decoder.
TEST(MultiRankGpu, SequenceParallelOnTheGpuEqualsOneProcess) {
  MMSP_REQUIRE_GPU();
  const int world = test::rank_env().world_size;
  dist::DeviceEnv shared;  // the launch sets MMSP_SHARE_GPU=1; the library reads no environment
  shared.share_gpu = std::getenv("MMSP_SHARE_GPU") != nullptr && std::string(std::getenv("MMSP_SHARE_GPU")) == "1";
  const dist::RankDevice rank = dist::use_rank_device(dist::DeviceRequest::cuda, test::rank_env(), shared);
  for (const char* config : {"tiny-qwen2-vl.json", "tiny-qwen3_5-vl.json"}) {
    const std::string ref_dir = scratch(std::string("ref-") + std::to_string(test::rank_env().rank));
    const train::TrainReport want = one_step(config, "float64", rank.device, ref_dir, dist::Mesh::solo());
    for (const plan::Mesh& shape : plan::all_meshes(world)) {
      // dp 1 (the reference packs one row); ulysses 3 cannot split the tiny models' 2 K/V heads
      if (shape.dp != 1 || shape.ulysses == 3) continue;
      const dist::Mesh mesh = test::make_mesh(shape, rank.collectives);
      const std::string dir = scratch("mesh");
      // one_step gives each rank 192 / world tokens: the same global batch as the reference
      const train::TrainReport got = one_step(config, "float64", rank.device, dir, mesh);
      EXPECT_NEAR(got.steps[0].loss, want.steps[0].loss, 1e-9 * want.steps[0].loss) << config << " " << shape.str();
      if (mesh.rank() == 0) expect_same_gradients(dir, ref_dir, 1e-9, std::string(config) + " " + shape.str());
      if (mesh.rank() == 0) std::filesystem::remove_all(dir);  // only rank 0 wrote it
    }
    std::filesystem::remove_all(ref_dir);
  }
}

}  // namespace
}  // namespace mmsp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mmsp::test::init_multirank();
  const int rc = RUN_ALL_TESTS();
  // Rank 0 serves the store: every rank meets here before any leaves (without a GPU the
  // cases skip at once, and rank 0 would otherwise end before the others joined).
  const int world = mmsp::test::rank_env().world_size;
  if (world > 1) {
    const mmsp::dist::Mesh mesh = mmsp::test::make_mesh(mmsp::plan::Mesh{1, 1, world});
    at::Tensor t = at::zeros({1});
    mmsp::dist::all_reduce_(t, *mesh.world());
  }
  return rc;
}
