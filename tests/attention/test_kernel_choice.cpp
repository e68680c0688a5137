// `--attention-kernel auto` by measurement (kernel_choice.h), on the CPU: real kernels of
// the registry beside kernels registered only here — one deliberately wrong (a real local
// attention with the wrong softmax scale), one that errors — with fake timings injected.
// The wrong one and the erroring one must be skipped with their reasons, the fastest that
// passes must win, a choice is measured once per key, and on several ranks every rank takes
// the same kernel although each rank's timings and probes differ.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>

#include "mmsp/attention/kernel_choice.h"
#include "mmsp/attention/local_attention.h"
#include "mmsp/core/check.h"
#include "multirank.h"

using namespace mmsp;
using namespace mmsp::attention;
using ::testing::HasSubstr;

namespace {

const LocalKernel& registered(const std::string& name) { return *parse_attention_kernel(name).pinned; }

// The blockwise kernel with the softmax scale 1.5 times too large: real attention, wrong.
class WrongScaleKernel : public LocalKernel {
 public:
  explicit WrongScaleKernel(const char* name = "wrong-scale") : name_(name) {}
  const char* name() const override { return name_; }
  bool automatic_on(const at::Device&) const override { return true; }
  std::shared_ptr<const KernelPart> plan(const TokenLayout& q, const TokenLayout& k, const AttentionOptions& o,
                                         const at::Device& device, std::string* why_not) const override {
    return inner().plan(q, k, o, device, why_not);
  }
  const char* serves(const at::Tensor& q, std::string* why_not) const override { return inner().serves(q, why_not); }
  PartialAttention forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KernelPart& plan,
                           const AttentionOptions& o) const override {
    return inner().forward(q, k, v, plan, wrong(q, o));
  }
  AttentionGrads backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const KernelPart& plan,
                          const AttentionOptions& o) const override {
    return inner().backward(dout, q, k, v, out, lse, plan, wrong(q, o));
  }

 private:
  static const LocalKernel& inner() { return registered("blockwise"); }
  static AttentionOptions wrong(const at::Tensor& q, AttentionOptions o) {
    o.scale = 1.5 / std::sqrt(static_cast<double>(q.size(2)));
    return o;
  }
  const char* name_;
};

// Plans and serves, then fails in its forward.
class ErroringKernel : public WrongScaleKernel {
 public:
  ErroringKernel() : WrongScaleKernel("erroring") {}
  PartialAttention forward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const KernelPart&,
                           const AttentionOptions&) const override {
    MMSP_FAIL("deliberate failure of the test's kernel");
  }
};

// Fake seconds per kernel name; counts the timed calls (warm-up included) without running.
struct FakeTimes {
  std::map<std::string, double> seconds;
  int calls = 0;
  std::function<double(const LocalKernel&, const std::function<void()>&)> fn() {
    return [this](const LocalKernel& k, const std::function<void()>&) {
      ++calls;
      return seconds.at(k.name());
    };
  }
};

ChoiceInputs cpu_inputs(std::vector<const LocalKernel*> candidates, FakeTimes& times) {
  ChoiceInputs in;
  in.candidates = std::move(candidates);
  in.probe_tokens = 96;
  in.time = times.fn();
  return in;
}

const CandidateRow& row_of(const KernelChoice& c, const std::string& name) {
  for (const CandidateRow& r : c.table)
    if (r.kernel == name) return r;
  throw std::runtime_error("no row " + name);
}

TEST(KernelChoiceTest, AWrongKernelIsSkippedHoweverFast) {
  const WrongScaleKernel wrong;
  FakeTimes times{{{"wrong-scale", 0.001}, {"fused", 2.0}, {"blockwise", 3.0}}};
  for (at::ScalarType dtype : {at::kDouble, at::kBFloat16}) {
    const ChoiceKey key = choice_key(dtype, 4, 2, 16, 200, true);
    const KernelChoice c =
        choose_kernel(key, cpu_inputs({&wrong, &registered("fused"), &registered("blockwise")}, times));
    EXPECT_STREQ(c.chosen->name(), "fused") << c.table_text();
    const CandidateRow& w = row_of(c, "wrong-scale");
    EXPECT_FALSE(w.passed);
    EXPECT_THAT(w.reason, HasSubstr("failed the probe: out error"));
    EXPECT_GT(w.out_error, probe_tolerance(dtype).out);
    EXPECT_EQ(w.seconds, -1) << "a kernel that failed its probe is not timed";
    EXPECT_THAT(c.table_text(), HasSubstr("wrong-scale (blockwise): skipped: failed the probe"));
    EXPECT_THAT(c.table_text(), HasSubstr("fused (cpu-flash): 2000.000 ms"));
    EXPECT_LE(row_of(c, "fused").out_error, probe_tolerance(dtype).out);
  }
}

TEST(KernelChoiceTest, TheFastestPassingKernelWins) {
  FakeTimes times{{{"fused", 1.0}, {"blockwise", 2.0}}};
  const ChoiceKey key = choice_key(at::kFloat, 4, 4, 8, 1000, true);
  EXPECT_EQ(key.tokens, 1024);
  const std::vector<const LocalKernel*> both{&registered("blockwise"), &registered("fused")};
  EXPECT_STREQ(choose_kernel(key, cpu_inputs(both, times)).chosen->name(), "fused");
  times.seconds["fused"] = 3.0;
  const KernelChoice c = choose_kernel(key, cpu_inputs(both, times));
  EXPECT_STREQ(c.chosen->name(), "blockwise");
  EXPECT_EQ(row_of(c, "fused").seconds, 3.0);  // the median of the repeats
  EXPECT_THAT(c.table_text(), HasSubstr("blockwise (blockwise): 2000.000 ms"));
  EXPECT_THAT(c.table_text(), HasSubstr("<- chosen"));
}

TEST(KernelChoiceTest, ErroringAndUnservingKernelsAreSkippedWithTheirReasons) {
  const ErroringKernel erroring;
  FakeTimes times{{{"erroring", 0.1}, {"cudnn", 0.1}, {"blockwise", 1.0}}};
  const ChoiceKey key = choice_key(at::kBFloat16, 4, 1, 16, 64, false);
  const KernelChoice c =
      choose_kernel(key, cpu_inputs({&erroring, &registered("cudnn"), &registered("blockwise")}, times));
  EXPECT_STREQ(c.chosen->name(), "blockwise");
  EXPECT_THAT(row_of(c, "erroring").reason, HasSubstr("error: deliberate failure of the test's kernel"));
  EXPECT_THAT(row_of(c, "cudnn").reason,
              HasSubstr("does not serve BFloat16 on cpu: cuDNN attention runs on CUDA tensors; these are on cpu"));
  EXPECT_EQ(times.calls, 4) << "only the blockwise kernel is timed: one warm-up and three repeats";
}

TEST(KernelChoiceTest, EachKeyIsMeasuredOnce) {
  FakeTimes times{{{"fused", 1.0}, {"blockwise", 2.0}}};
  KernelChooser chooser(cpu_inputs({&registered("fused"), &registered("blockwise")}, times));
  const ChoiceKey a = choice_key(at::kFloat, 2, 2, 8, 300, true), b = choice_key(at::kFloat, 2, 2, 8, 500, true);
  EXPECT_EQ(a.tokens, b.tokens);  // one bucket: 512
  chooser.choose(a);
  const int calls = times.calls;
  EXPECT_STREQ(chooser.choose(b).chosen->name(), "fused");
  EXPECT_EQ(times.calls, calls);
  chooser.choose(choice_key(at::kFloat, 2, 1, 8, 300, true));  // another GQA ratio: measured
  EXPECT_EQ(chooser.measured(), 2u);
  EXPECT_GT(times.calls, calls);
}

TEST(KernelChoiceTest, NoPassingKernelIsAnErrorWithTheTable) {
  const WrongScaleKernel wrong;
  FakeTimes times{{{"wrong-scale", 1.0}}};
  try {
    choose_kernel(choice_key(at::kDouble, 2, 2, 8, 64, true), cpu_inputs({&wrong}, times));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no kernel passed its probe"));
    EXPECT_THAT(e.what(), HasSubstr("wrong-scale (blockwise): skipped: failed the probe"));
  }
}

// Each rank times the kernels differently (rank 0 finds fused faster, the others blockwise)
// and a kernel is wrong on the last rank only: every rank takes the same kernel, the wrong
// one is skipped everywhere, and the seconds in every rank's table are the slowest rank's.
class WrongOnOneRankKernel : public WrongScaleKernel {
 public:
  explicit WrongOnOneRankKernel(bool wrong_here) : WrongScaleKernel("wrong-on-one-rank"), wrong_here_(wrong_here) {}
  PartialAttention forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KernelPart& plan,
                           const AttentionOptions& o) const override {
    if (wrong_here_) return WrongScaleKernel::forward(q, k, v, plan, o);
    return registered("blockwise").forward(q, k, v, plan, o);
  }
  AttentionGrads backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const KernelPart& plan,
                          const AttentionOptions& o) const override {
    if (wrong_here_) return WrongScaleKernel::backward(dout, q, k, v, out, lse, plan, o);
    return registered("blockwise").backward(dout, q, k, v, out, lse, plan, o);
  }

 private:
  bool wrong_here_;
};

TEST(MultiRankKernelChoice, EveryRankTakesTheSameKernel) {
  const dist::Mesh& mesh = test::all_meshes().front();
  const int P = mesh.world_size(), r = mesh.rank();
  const WrongOnOneRankKernel odd(r == P - 1);
  FakeTimes times{{{"wrong-on-one-rank", 0.01}, {"fused", r == 0 ? 1.0 : 5.0}, {"blockwise", r == 0 ? 4.0 : 2.0}}};
  ChoiceInputs in = cpu_inputs({&odd, &registered("fused"), &registered("blockwise")}, times);
  in.agree = agree_over(mesh.world());
  const KernelChoice c = choose_kernel(choice_key(at::kDouble, 4, 2, 8, 256, true), in);
  EXPECT_STREQ(c.chosen->name(), "blockwise") << c.table_text();  // max(1, 5) = 5 > max(4, 2) = 4
  EXPECT_EQ(row_of(c, "fused").seconds, 5.0);
  EXPECT_EQ(row_of(c, "blockwise").seconds, 4.0);
  EXPECT_FALSE(row_of(c, "wrong-on-one-rank").passed);
  EXPECT_THAT(row_of(c, "wrong-on-one-rank").reason,
              HasSubstr(r == P - 1 ? "failed the probe" : "passed here, but failed or errored on another rank"));
}

}  // namespace
