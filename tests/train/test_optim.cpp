// Optimisation pieces: bucketed gradient sync (solo group, and two Gloo ranks in
// threads of this process), the learning-rate schedule, clipping, AdamW groups.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cmath>
#include <functional>
#include <thread>

#include "error_of.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/parallel/grad_sync.h"
#include "mmsp/parallel/zero/zero_hooks.h"
#include "mmsp/train/optim/grad_clip.h"
#include "mmsp/train/optim/lr_schedule.h"
#include "mmsp/train/optim/optimizer.h"
#include "mmsp/train/optim/sharded_adamw.h"

namespace mmsp::train {
namespace {

using ::testing::HasSubstr;

at::Tensor param(std::vector<int64_t> shape, at::ScalarType dtype) {
  return at::zeros(shape, dtype).requires_grad_(true);
}

// Grad values that say which parameter and element they are: 1000·(i+1) + element.
void set_coded_grad(at::Tensor& p, int i) {
  p.mutable_grad() = (at::arange(p.numel(), at::kDouble) + 1000.0 * (i + 1)).to(p.scalar_type()).view(p.sizes());
}

using test::error_of;

TEST(GradSync, BucketsByDtypeInOrderAndOversizedParamsAlone) {
  // bytes: a 16, b 24, c 40, d 8, e 160, f 10.
  model::NamedParams ps = {{"a", param({4}, at::kFloat)},     {"b", param({3}, at::kDouble)},
                           {"c", param({10}, at::kFloat)},    {"d", param({2}, at::kFloat)},
                           {"e", param({4, 5}, at::kDouble)}, {"f", param({5}, at::kBFloat16)}};
  parallel::GradSync sync(ps, dist::make_solo_group("world", 0), /*bucket_bytes=*/48);
  std::vector<std::vector<size_t>> got;
  for (const parallel::GradBucket& b : sync.buckets()) got.push_back(b.params);
  // fp32: [a] (a + c = 56 > 48), [c, d] (48 fits exactly); fp64: [b], [e] (160 > 48 alone); bf16: [f].
  EXPECT_EQ(got, (std::vector<std::vector<size_t>>{{0}, {2, 3}, {1}, {4}, {5}}));
  EXPECT_EQ(sync.buckets()[1].bytes, 48);
  EXPECT_EQ(sync.buckets()[3].dtype, at::kDouble);
  EXPECT_EQ(sync.buckets()[4].dtype, at::kBFloat16);
  EXPECT_EQ(sync.grad_bytes(), 16 + 24 + 40 + 8 + 160 + 10);
}

TEST(GradSync, SoloGroupCopiesBackEveryGradAndZerosTheMissing) {
  // 40 parameters of four dtypes and assorted sizes, bucket smaller than many.
  const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};
  model::NamedParams ps;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 40; ++i) {
    at::Tensor p = param({1 + i % 7, 1 + (i * 5) % 9}, types[i % 4]);
    if (i % 5 != 3) {
      set_coded_grad(p, i);
      if (i % 6 == 1) p.mutable_grad() = p.grad().t().contiguous().t();  // non-contiguous grad
      expected.push_back(p.grad().clone());
    } else {
      expected.push_back(at::zeros_like(p));  // no grad: zeros afterwards
    }
    ps.emplace_back("p" + std::to_string(i), p);
  }
  auto stats = std::make_shared<dist::CommStats>();
  parallel::GradSync sync(ps, dist::make_solo_group("world", 0, stats), /*bucket_bytes=*/64);
  EXPECT_GT(sync.buckets().size(), 8u);
  sync.all_reduce();
  for (size_t i = 0; i < ps.size(); ++i) {
    const at::Tensor& g = ps[i].second.grad();
    ASSERT_TRUE(g.defined()) << ps[i].first;
    EXPECT_EQ(g.scalar_type(), ps[i].second.scalar_type()) << ps[i].first;
    EXPECT_TRUE(at::equal(g, expected[i])) << ps[i].first;
  }
  // Grads made from the bucket do not share its storage (or each other's).
  ps[3].second.mutable_grad().fill_(7);
  EXPECT_TRUE(at::equal(ps[7].second.grad(), expected[7]));
  // A one-member group moves nothing and counts nothing.
  EXPECT_EQ(stats->snapshot().total_bytes(), 0);
}

TEST(GradSync, RefusesBadParameters) {
  at::Tensor w = param({2, 2}, at::kFloat);
  auto solo = dist::make_solo_group("world", 0);
  EXPECT_THAT(error_of([&] {
                parallel::GradSync({{"w", w}, {"tied", w}}, solo);
              }),
              HasSubstr("\"tied\" is the same tensor as \"w\""));
  EXPECT_THAT(error_of([&] {
                parallel::GradSync({{"w", w}, {"w", param({1}, at::kFloat)}}, solo);
              }),
              HasSubstr("\"w\" appears twice"));
  EXPECT_THAT(error_of([&] {
                parallel::GradSync({{"i", at::zeros({2}, at::kLong)}}, solo);
              }),
              HasSubstr("only floating-point"));
  EXPECT_THAT(error_of([&] { parallel::GradSync({{"w", w}}, solo, 0); }), HasSubstr("bucket_bytes (0)"));
}

// Two Gloo ranks as two threads of this process: sums and byte counts.
TEST(GradSync, TwoGlooRanksSumEveryGradAndCountTheBytes) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kBFloat16};
  auto make_params = [&](int rank) {
    model::NamedParams ps;
    for (int i = 0; i < 12; ++i) {
      at::Tensor p = param({1 + i % 4, 3}, types[i % 3]);
      if (!(rank == 1 && i % 4 == 2)) {  // rank 1 never reached some parameters
        set_coded_grad(p, i);
        p.mutable_grad().mul_(rank + 1);
      }
      ps.emplace_back("p" + std::to_string(i), p);
    }
    return ps;
  };
  std::vector<model::NamedParams> params = {make_params(0), make_params(1)};
  std::vector<std::shared_ptr<dist::CommStats>> stats = {std::make_shared<dist::CommStats>(),
                                                         std::make_shared<dist::CommStats>()};
  std::vector<int64_t> grad_bytes(2), buckets(2);
  std::vector<std::string> errors(2);
  auto run = [&](int rank) {
    try {
      auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2, options);
      auto world = c10::make_intrusive<dist::Group>(
          "world", std::vector<int>{0, 1}, rank, c10::intrusive_ptr<dist::Backend>(gloo),
          c10::intrusive_ptr<dist::Backend>(), stats[rank], std::chrono::milliseconds(30000));
      parallel::GradSync sync(params[rank], world, /*bucket_bytes=*/40);
      sync.all_reduce();
      grad_bytes[rank] = sync.grad_bytes();
      buckets[rank] = static_cast<int64_t>(sync.buckets().size());
    } catch (const std::exception& e) { errors[rank] = e.what(); }
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (int i = 0; i < 12; ++i) {
    const at::Tensor& p = params[0][i].second;
    // rank 0 gave c, rank 1 gave 2c or nothing: 3c or c, exact in fp32 / fp64 (bf16 is
    // summed in fp32 by Gloo and rounded once, as this rounds 3c once).
    at::Tensor c = (at::arange(p.numel(), at::kDouble) + 1000.0 * (i + 1)).to(p.scalar_type());
    at::Tensor want = (c.to(at::kDouble) * (i % 4 == 2 ? 1 : 3)).to(p.scalar_type()).view(p.sizes());
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(at::equal(params[r][i].second.grad(), want)) << "rank " << r << " p" << i;
  }
  for (int r = 0; r < 2; ++r) {
    const dist::CommSnapshot snapshot = stats[r]->snapshot();
    const dist::CommCount& c = snapshot.at(dist::CommKind::all_reduce, dist::Pass::forward);
    EXPECT_EQ(c.calls, buckets[r]);
    // A ring all-reduce over 2 ranks sends 2·(2−1)/2 = 1× the payload: every grad byte once.
    EXPECT_EQ(c.bytes, grad_bytes[r]);
  }
}

TEST(LrSchedule, WarmupThenCosineToTheFloor) {
  const LrSchedule s{1e-3, 1e-5, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);  // lr · 1/10
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);                         // the last warm-up step reaches lr
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);                        // the cosine starts at lr
  EXPECT_NEAR(s.at(60), 1e-5 + (1e-3 - 1e-5) / 2, 1e-15);  // half way
  EXPECT_NEAR(s.at(109), 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + std::cos(M_PI * 99 / 100)), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-5);
  EXPECT_DOUBLE_EQ(s.at(5000), 1e-5);
  for (int64_t step = 10; step < 110; ++step) EXPECT_GT(s.at(step), s.at(step + 1)) << step;

  const LrSchedule none{2e-4, 0.0, 0, 4};
  EXPECT_DOUBLE_EQ(none.at(0), 2e-4);
  EXPECT_DOUBLE_EQ(none.at(2), 1e-4);
  EXPECT_DOUBLE_EQ(none.at(4), 0.0);
  const LrSchedule all_warmup{2e-4, 1e-6, 4, 4};
  EXPECT_DOUBLE_EQ(all_warmup.at(3), 2e-4);
  EXPECT_DOUBLE_EQ(all_warmup.at(4), 1e-6);
}

TEST(LrSchedule, RefusesBadValues) {
  EXPECT_THAT(error_of([] { LrSchedule{0.0, 0.0, 0, 10}.validate(); }), HasSubstr("lr (0)"));
  EXPECT_THAT(error_of([] {
                LrSchedule{1e-3, 2e-3, 0, 10}.validate();
              }),
              HasSubstr("min_lr (0.002) must be in [0, lr (0.001)]"));
  EXPECT_THAT(error_of([] {
                LrSchedule{1e-3, 0.0, 11, 10}.validate();
              }),
              HasSubstr("warmup_steps (11) must be in [0, total_steps (10)]"));
  EXPECT_THAT(error_of([] { LrSchedule{1e-3, 0.0, 0, 0}.validate(); }), HasSubstr("total_steps (0)"));
  EXPECT_THAT(error_of([] { LrSchedule{1e-3, 0.0, 0, 10}.at(-1); }), HasSubstr("step (-1)"));
}

TEST(ClipGradNorm, GlobalNormInFp64AndScaling) {
  at::Tensor a = param({2}, at::kFloat), b = param({1, 1}, at::kDouble), c = param({3}, at::kFloat);
  a.mutable_grad() = at::tensor({3.0f, 4.0f});
  b.mutable_grad() = at::full({1, 1}, 12.0, at::kDouble);
  model::NamedParams ps = {{"a", a}, {"b", b}, {"c", c}};  // c: no grad, counts as zeros
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 0.0), 13.0);         // measure only
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 20.0), 13.0);        // below the limit: unchanged
  EXPECT_TRUE(at::equal(a.grad(), at::tensor({3.0f, 4.0f})));
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 6.5), 13.0);  // returns the norm before clipping
  const double scale = 6.5 / (13.0 + 1e-6);
  EXPECT_TRUE(at::allclose(a.grad(), at::tensor({3.0f, 4.0f}) * scale));
  EXPECT_DOUBLE_EQ(b.grad().item<double>(), 12.0 * scale);
  EXPECT_NEAR(clip_grad_norm(ps, 0.0), 6.5, 1e-6);
  EXPECT_FALSE(c.grad().defined());

  // fp16 grads whose squares overflow fp16 still give the exact norm.
  at::Tensor h = param({2}, at::kHalf);
  h.mutable_grad() = at::full({2}, 300.0, at::kHalf);  // 300² = 90000 > fp16 max
  EXPECT_DOUBLE_EQ(clip_grad_norm({{"h", h}}, 0.0), std::sqrt(2.0) * 300.0);
}

TEST(ClipGradNorm, NonFiniteNormNamesTheParameter) {
  at::Tensor a = param({2}, at::kFloat), b = param({2}, at::kFloat);
  a.mutable_grad() = at::ones({2});
  b.mutable_grad() = at::tensor({1.0f, std::nanf("")});
  const std::string message = error_of([&] { clip_grad_norm({{"a", a}, {"b.weight", b}}, 1.0); });
  EXPECT_THAT(message, HasSubstr("gradient norm is nan (not finite)"));
  EXPECT_THAT(message, HasSubstr("\"b.weight\""));
  EXPECT_TRUE(at::equal(a.grad(), at::ones({2})));  // nothing scaled
}

TEST(AdamW, DecayOnMatricesOnlyAndSetLr) {
  model::NamedParams ps = {{"embed", param({10, 4}, at::kFloat)}, {"bias", param({4}, at::kFloat)},
                           {"proj", param({4, 4}, at::kDouble)},  {"norm", param({4}, at::kFloat)},
                           {"scale", param({}, at::kFloat)},      {"conv", param({2, 3, 2, 2}, at::kFloat)}};
  auto opt = make_adamw(ps, {3e-4, 0.9, 0.95, 1e-6, 0.1});
  ASSERT_EQ(opt->param_groups().size(), 2u);
  auto names = [&](size_t g) {
    std::vector<std::string> out;
    for (const at::Tensor& t : opt->param_groups()[g].params())
      for (const auto& [name, p] : ps)
        if (p.is_same(t)) out.push_back(name);
    return out;
  };
  EXPECT_EQ(names(0), (std::vector<std::string>{"embed", "proj", "conv"}));
  EXPECT_EQ(names(1), (std::vector<std::string>{"bias", "norm", "scale"}));
  auto options = [&](size_t g) {
    return static_cast<const torch::optim::AdamWOptions&>(opt->param_groups()[g].options());
  };
  EXPECT_EQ(options(0).weight_decay(), 0.1);
  EXPECT_EQ(options(1).weight_decay(), 0.0);
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_EQ(options(g).lr(), 3e-4);
    EXPECT_EQ(std::get<0>(options(g).betas()), 0.9);
    EXPECT_EQ(std::get<1>(options(g).betas()), 0.95);
    EXPECT_EQ(options(g).eps(), 1e-6);
    EXPECT_FALSE(options(g).amsgrad());
  }
  set_lr(*opt, 1.5e-5);
  EXPECT_EQ(options(0).lr(), 1.5e-5);
  EXPECT_EQ(options(1).lr(), 1.5e-5);

  // No matrices (or no vectors) still gives both groups, so checkpoints line up.
  auto only_vectors = make_adamw({{"b", param({3}, at::kFloat)}}, {});
  ASSERT_EQ(only_vectors->param_groups().size(), 2u);
  EXPECT_TRUE(only_vectors->param_groups()[0].params().empty());
}

TEST(AdamW, RefusesBadOptions) {
  model::NamedParams ps = {{"w", param({2, 2}, at::kFloat)}};
  EXPECT_THAT(error_of([&] {
                make_adamw(ps, {1e-3, 0.9, 1.0, 1e-8, 0.0});
              }),
              HasSubstr("betas (0.9, 1) must each be in [0, 1)"));
  EXPECT_THAT(error_of([&] { make_adamw(ps, {-1.0, 0.9, 0.99, 1e-8, 0.0}); }), HasSubstr("lr (-1)"));
  EXPECT_THAT(error_of([&] { make_adamw(ps, {1e-3, 0.9, 0.99, 0.0, 0.0}); }), HasSubstr("eps (0)"));
  EXPECT_THAT(error_of([&] { make_adamw(ps, {1e-3, 0.9, 0.99, 1e-8, -0.1}); }), HasSubstr("weight_decay (-0.1)"));
  EXPECT_THAT(error_of([&] { make_adamw({{"w", ps[0].second}, {"v", ps[0].second}}, {}); }), HasSubstr("same tensor"));
  auto opt = make_adamw(ps, {});
  EXPECT_THAT(error_of([&] { set_lr(*opt, std::nan("")); }), HasSubstr("set_lr: lr (nan)"));
}

// ---- ShardedAdamW (--shard optimizer) ----------------------------------------------

// P Gloo ranks as threads of this process; `body(rank, world)` runs on each.
void run_gloo_ranks(int P, const std::function<void(int, dist::GroupPtr)>& body,
                    std::vector<std::shared_ptr<dist::CommStats>>& stats) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(P);
  stats.clear();
  for (int r = 0; r < P; ++r) stats.push_back(std::make_shared<dist::CommStats>());
  std::vector<int> members;
  for (int r = 0; r < P; ++r) members.push_back(r);
  auto run = [&](int rank) {
    try {
      auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, P, options);
      auto world = c10::make_intrusive<dist::Group>("world", members, rank, c10::intrusive_ptr<dist::Backend>(gloo),
                                                    c10::intrusive_ptr<dist::Backend>(), stats[rank],
                                                    std::chrono::milliseconds(30000));
      body(rank, world);
    } catch (const std::exception& e) { errors[rank] = e.what(); }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r) threads.emplace_back(run, r);
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
}

// Random values from a generator of their own (the ranks are threads: the default
// generator would be shared).
at::Tensor seeded_randn(at::IntArrayRef shape, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble));
}

// Parameters of odd sizes (60 elements: no bucket divides by 3 or 4), matrices and
// vectors, rounded to `dtype` and then held in `held` (a reference's masters).
constexpr int64_t kOddElements = 60;
model::NamedParams odd_params(at::ScalarType dtype, at::ScalarType held) {
  model::NamedParams ps;
  const std::vector<std::vector<int64_t>> shapes = {{5, 3}, {7}, {2, 2, 3}, {1}, {11, 2}, {3}};
  for (size_t i = 0; i < shapes.size(); ++i)
    ps.emplace_back("p" + std::to_string(i), seeded_randn(shapes[i], 7 + i).to(dtype).to(held).requires_grad_(true));
  return ps;
}
model::NamedParams odd_params(at::ScalarType dtype) { return odd_params(dtype, dtype); }

// The gradient rank r gives parameter i at step t (rank 2 never reaches p3).
at::Tensor rank_grad(const at::Tensor& p, int r, size_t i, int t) {
  return seeded_randn(p.sizes(), 1000 * t + 10 * i + r);
}

// The units stages 2 and 3 see, numbered as the decoder numbers them: layers, the
// head, an untied embedding (model::Decoder::hook_units).
struct UnitCase {
  std::vector<int> unit_of;  // per parameter; −1: kept for the step
  std::vector<parallel::ShardUnitUse> uses;
  int head = -1, embedding = -1;  // tied: the same unit
  int vision = -1;                // a vision block: used after the lookup, its backward after layer 0's
  int unread = -1;                // a unit the step never reads: no hooks, a zero gradient
};
// p0, p1 decoder layer 0; p2, p3 layer 1; p4, p5 outside.
UnitCase layers_only() { return {{0, 0, 1, 1, -1, -1}, {}, -1, -1}; }
// p4 (11 × 2) the head tied to the embedding: gathered for the lookup, the loss and its
// backward; its gradient comes in two parts: the loss's, dense, reduced in its
// backward, and the lookup's rows after the backward.
UnitCase tied_head() { return {{0, 0, 1, 1, 2, -1}, {{}, {}, {3, true, true, true}}, 2, 2}; }
// p3 an untied head (rank 2 gives it no gradient), p4 the embedding: gathered once, not
// prefetched, its only gradient the lookup's rows.
UnitCase untied_head() { return {{0, 0, 1, 2, 3, -1}, {{}, {}, {2, true, true}, {1, false, false, true}}, 2, 3}; }
// The tied head, and p5 a vision block: the first of its chain (not prefetched), so
// neither the lookup before it nor its own backward, the last, issues a neighbour's
// gather (model::HookedBlocks::units).
UnitCase tied_head_and_vision_block() {
  return {{0, 0, 1, 1, 2, 3}, {{}, {}, {3, true, true, true}, {2, true, false}}, 2, 2, 3};
}
// p4 a unit the step never reads (LLaVA's CLIP layer above vision_feature_layer): never
// gathered, nothing reduced, a zero gradient as the replicated path gives an untouched
// parameter (decay still applies).
UnitCase unread_block() { return {{0, 0, 1, 1, 2, -1}, {{}, {}, {0, false, false}}, -1, -1, -1, 2}; }

bool holds_memory(const at::Tensor& p) { return p.storage().nbytes() > 0; }

// 3 steps of ShardedAdamW on P ranks equal 3 steps of the replicated AdamW on the summed
// gradients, with clipping that bites and decay on the matrices only; each step sends
// the bytes its formula says. Stages 2 and 3 run the model's hooks as a forward and
// backward would: the embedding's lookup, the two layers, the head's loss, then the
// backward in reverse, each unit's gradients appearing during its backward (the
// embedding's at the end, as the lookup's rows: duplicate ids, in any order, counts
// unequal over the ranks, and with 4 ranks one rank without rows); stage 3 holds a
// unit's weights only between its before and after hooks.
void expect_sharded_equals_replicated(int P, at::ScalarType model_dtype, at::ScalarType master_dtype, double rtol,
                                      parallel::ShardLevel level = parallel::ShardLevel::optimizer,
                                      const UnitCase& units = layers_only()) {
  const AdamWOptions adamw{0.05, 0.9, 0.95, 1e-8, 0.1};
  const double clip = 1.5;
  // Reference: the replicated path of the trainer (masters, summed grads, clip, AdamW).
  model::NamedParams ref = odd_params(model_dtype, master_dtype);
  auto opt = make_adamw(ref, adamw);
  for (int t = 0; t < 3; ++t) {
    for (size_t i = 0; i < ref.size(); ++i) {
      at::Tensor sum = at::zeros(ref[i].second.sizes(), at::kDouble);
      for (int r = 0; r < P; ++r)
        if (!(r == 2 && i == 3) && units.unit_of[i] != units.unread)
          sum += rank_grad(ref[i].second, r, i, t).to(model_dtype).to(at::kDouble);
      ref[i].second.mutable_grad() = sum.to(master_dtype);
    }
    clip_grad_norm(ref, clip);
    opt->step();
  }
  const std::vector<int>& unit_of = units.unit_of;
  const bool tied = units.head >= 0 && units.head == units.embedding;
  std::vector<model::NamedParams> got(P);
  std::vector<double> norms(P);
  std::vector<int64_t> state_bytes(P), step_bytes(P), sent(P), row_bytes(P), rows_sent(P);
  std::vector<std::shared_ptr<dist::CommStats>> stats;
  run_gloo_ranks(
      P,
      [&](int r, dist::GroupPtr world) {
        model::NamedParams model = odd_params(model_dtype);
        const auto zero = std::make_shared<parallel::ShardedModel>(model, master_dtype, world, /*bucket_bytes=*/64,
                                                                   level, unit_of, units.uses);
        ShardedAdamW sharded(zero, adamw);
        const bool freed = level == parallel::ShardLevel::parameters;
        const std::shared_ptr<model::LayerHooks> hooks = parallel::make_zero_hooks(zero);
        EXPECT_EQ(hooks == nullptr, level == parallel::ShardLevel::optimizer);
        // Unit `unit`'s gradients, times `scale` (added to what is there: a tied head's
        // gradient comes in two parts, each exactly half).
        auto give_grads = [&](int unit, int t, double scale = 1.0) {
          if (unit == units.unread) return;
          for (size_t i = 0; i < model.size(); ++i)
            if (unit_of[i] == unit && !(r == 2 && i == 3)) {
              at::Tensor g = (rank_grad(model[i].second, r, i, t) * scale).to(model_dtype);
              at::Tensor& grad = model[i].second.mutable_grad();
              grad = grad.defined() ? grad + g : g;
            }
        };
        auto unit_held = [&](int unit) {
          for (size_t i = 0; i < model.size(); ++i)
            if (unit_of[i] == unit && holds_memory(model[i].second) != true) return false;
          return true;
        };
        auto gathered = [&] { return stats[r]->snapshot().at(dist::CommKind::all_gather, dist::Pass::forward).bytes; };
        // Rank q's lookup gradient for step t (times `scale`) as rows: rank 0's one per table
        // row, the others' two half-rows per table row, the second set in reverse order.
        const size_t table = std::find(unit_of.begin(), unit_of.end(), units.embedding) - unit_of.begin();
        auto lookup_rows = [&](int q, int t, double scale) {
          const at::Tensor g = (rank_grad(model[table].second, q, table, t) * scale).to(model_dtype);
          const int64_t V = g.size(0);
          const at::Tensor ids = at::arange(V, at::kLong);
          if (q == 0) return std::make_pair(ids, g);
          return std::make_pair(at::cat({ids, ids.flip(0)}), at::cat({g * 0.5, (g * 0.5).flip(0)}));
        };
        int64_t most_rows = 0;  // the most rows a rank hands over in a step
        for (int q = 0; q < P; ++q)
          most_rows = std::max<int64_t>(most_rows, q == 0 ? (P == 4 ? 33 : 11) : q == 3 ? 0 : 22);
        // Whether unit u's hook issues the gather of unit u + step too (then it sends bytes):
        // forward, when u + 1 is prefetched; backward, when u is (u − 1 comes before it).
        auto prefetches = [&](int u, int step) {
          const int next = u + step, chained = step > 0 ? next : u;
          const bool exists = std::find(unit_of.begin(), unit_of.end(), next) != unit_of.end();
          return exists && (static_cast<size_t>(chained) >= units.uses.size() || units.uses[chained].prefetched);
        };
        // One forward use of a unit: held inside, freed after (stage 3); `prefetched`: its
        // gather was issued by the unit before it, so its own hook sends nothing (unless it
        // prefetches the next).
        auto use = [&](int unit, bool prefetched) {
          const int64_t before = gathered();
          hooks->before_forward(unit);
          EXPECT_TRUE(unit_held(unit)) << "forward of unit " << unit;
          if (freed && prefetched && !prefetches(unit, 1)) {
            EXPECT_EQ(gathered(), before) << "unit " << unit << " was prefetched";
          }
          if (freed && unit == 0) {
            EXPECT_FALSE(unit_held(1)) << "layer 1 is prefetched into a buffer, not the model";
          }
          hooks->after_forward(unit);
          EXPECT_EQ(unit_held(unit), !freed) << "after the forward of unit " << unit;
        };
        for (int t = 0; t < 3; ++t) {
          sharded.zero_grad();
          if (!hooks) {
            for (int unit : {0, 1, 2, 3, -1}) give_grads(unit, t);
          } else {
            for (size_t i = 0; i < model.size(); ++i)
              EXPECT_EQ(holds_memory(model[i].second), !freed) << "between steps";
            zero->gather_step_weights();
            for (size_t i = 0; i < model.size(); ++i)
              if (unit_of[i] < 0) { EXPECT_TRUE(holds_memory(model[i].second)) << "kept for the step"; }
            if (units.embedding >= 0) use(units.embedding, false);
            if (units.vision >= 0) use(units.vision, false);
            use(0, false);
            use(1, true);
            if (units.head >= 0) use(units.head, true);
            std::vector<int> backward = {1, 0};
            if (units.head >= 0) backward.insert(backward.begin(), units.head);
            if (units.vision >= 0) backward.push_back(units.vision);
            for (size_t k = 0; k < backward.size(); ++k) {
              const int unit = backward[k];
              const int64_t before = gathered();
              hooks->before_backward(unit);
              EXPECT_TRUE(unit_held(unit)) << "backward of unit " << unit;
              const bool was_prefetched = k > 0 && backward[k - 1] - 1 == unit && prefetches(backward[k - 1], -1);
              if (freed && was_prefetched && !prefetches(unit, -1)) {
                EXPECT_EQ(gathered(), before) << "unit " << unit << " was prefetched by the one after it";
              }
              give_grads(unit, t, tied && unit == units.head ? 0.5 : 1.0);
              hooks->after_backward(unit);
              for (size_t i = 0; i < model.size(); ++i)
                if (unit_of[i] == unit && !(r == 2 && i == 3)) {
                  EXPECT_FALSE(model[i].second.grad().defined()) << "reduced and released (unit " << unit << ")";
                }
            }
            if (units.embedding >= 0) {  // the lookup's rows, last; with 4 ranks rank 0 hands over rank 3's too
              const double scale = tied ? 0.5 : 1.0;
              std::vector<int> from = {r};
              if (P == 4 && r == 0) from.push_back(3);
              if (P == 4 && r == 3) from.clear();
              for (int q : from) {
                const auto [ids, rows] = lookup_rows(q, t, scale);
                hooks->lookup_backward(units.embedding, ids, rows);
              }
              EXPECT_FALSE(model[table].second.grad().defined()) << "the lookup makes no dense gradient";
            }
            give_grads(-1, t);
            if (units.unread >= 0) { EXPECT_EQ(unit_held(units.unread), !freed) << "an unread unit is never gathered"; }
          }
          norms[r] = sharded.step(clip);
        }
        const dist::CommSnapshot s = stats[r]->snapshot();
        sent[r] = s.at(dist::CommKind::reduce_scatter, dist::Pass::forward).bytes +
                  s.at(dist::CommKind::all_gather, dist::Pass::forward).bytes;
        rows_sent[r] = s.at(dist::CommKind::all_gather_v, dist::Pass::forward).bytes;
        row_bytes[r] = units.embedding >= 0 && hooks ? zero->lookup_row_bytes(most_rows) : 0;
        zero->gather_all();  // stage 3: the weights to compare (not a step's bytes)
        got[r] = model;
        state_bytes[r] = sharded.state_bytes();
        step_bytes[r] = zero->step_bytes();
      },
      stats);
  for (int r = 0; r < P; ++r) {
    for (size_t i = 0; i < ref.size(); ++i) {
      const at::Tensor want = ref[i].second.detach().to(model_dtype).to(at::kDouble);
      const at::Tensor have = got[r][i].second.detach().to(at::kDouble);
      EXPECT_TRUE(at::allclose(have, want, rtol, rtol)) << "P=" << P << " rank " << r << " " << ref[i].first << "\n"
                                                        << have << "\n"
                                                        << want;
    }
    EXPECT_EQ(sent[r], 3 * step_bytes[r]) << "rank " << r;
    EXPECT_EQ(rows_sent[r], 3 * row_bytes[r]) << "rank " << r << ": the lookup's rows";
    // A P-th of the state, plus the padding: fewer than P elements in each of at most
    // 6 buckets.
    const int64_t whole = 3 * kOddElements * static_cast<int64_t>(c10::elementSize(master_dtype));
    EXPECT_LT(state_bytes[r] * P, whole + 3 * 6 * P * static_cast<int64_t>(c10::elementSize(master_dtype)));
  }
  int64_t all = 0;
  for (int64_t b : state_bytes) all += b;
  EXPECT_GE(all, 3 * kOddElements * static_cast<int64_t>(c10::elementSize(master_dtype))) << "every element held";
}

TEST(ShardedAdamW, EqualsReplicatedAdamWOnTwoThreeAndFourRanks) {
  for (int P : {1, 2, 3, 4}) expect_sharded_equals_replicated(P, at::kDouble, at::kDouble, 1e-12);
}

TEST(ShardedAdamW, GradientsAndParametersLevelsEqualReplicatedAdamW) {
  for (parallel::ShardLevel level : {parallel::ShardLevel::gradients, parallel::ShardLevel::parameters})
    for (int P : {1, 3, 4}) expect_sharded_equals_replicated(P, at::kDouble, at::kDouble, 1e-12, level);
  expect_sharded_equals_replicated(2, at::kBFloat16, at::kFloat, 1e-2, parallel::ShardLevel::parameters);
}

// The head and the embedding as units of their own: gathered around each use, a tied
// head three times a step (its gradient reduced once, after the lookup adds the last
// part), an untied head twice (reduced after its backward) and the embedding once; and
// a vision block after the lookup, gathered twice, whose neighbours are not prefetched;
// and a unit the step never reads, never gathered nor reduced.
TEST(ShardedAdamW, HeadAndEmbeddingUnitsEqualReplicatedAdamW) {
  for (const UnitCase& units : {tied_head(), untied_head(), tied_head_and_vision_block(), unread_block()}) {
    for (parallel::ShardLevel level : {parallel::ShardLevel::gradients, parallel::ShardLevel::parameters})
      for (int P : {1, 2, 3, 4}) expect_sharded_equals_replicated(P, at::kDouble, at::kDouble, 1e-12, level, units);
    expect_sharded_equals_replicated(3, at::kBFloat16, at::kFloat, 1e-2, parallel::ShardLevel::parameters, units);
  }
}

// A bucket far larger than a reduce-scatter round goes in several rounds: the same sums
// and the bytes of one reduce-scatter of the whole bucket; the updated weights come
// back into the model in rounds too, whole and in place, with the bytes of one gather.
TEST(ShardedAdamW, LargeBucketsReduceInRounds) {
  const int64_t bucket_bytes = 64;  // rounds of 128 bytes: 16 fp64 elements over the ranks
  const int64_t elements = 1001;    // one parameter: a bucket of its own, many rounds
  for (int P : {2, 3}) {
    std::vector<std::shared_ptr<dist::CommStats>> stats;
    std::vector<at::Tensor> got(P);
    run_gloo_ranks(
        P,
        [&](int r, dist::GroupPtr world) {
          model::NamedParams model = {{"big", at::zeros({elements}, at::kDouble).requires_grad_(true)}};
          ShardedAdamW sharded(std::make_shared<parallel::ShardedModel>(model, at::kDouble, world, bucket_bytes),
                               AdamWOptions{1.0, 0.9, 0.999, 1e-8, 0.0});
          model[0].second.mutable_grad() = at::arange(elements, at::kDouble) * (r + 1);
          sharded.step(0);
          const int64_t shard = (elements + P - 1) / P;
          EXPECT_EQ(stats[r]->snapshot().at(dist::CommKind::reduce_scatter, dist::Pass::forward).bytes,
                    dist::shard_collective_bytes(shard * P * 8, P));
          const int64_t per_round = 2 * bucket_bytes / (P * 8);
          EXPECT_EQ(stats[r]->snapshot().at(dist::CommKind::reduce_scatter, dist::Pass::forward).calls,
                    (shard + per_round - 1) / per_round)
              << "in rounds";
          EXPECT_EQ(stats[r]->snapshot().at(dist::CommKind::all_gather, dist::Pass::forward).bytes,
                    dist::shard_collective_bytes(shard * P * 8, P));
          EXPECT_EQ(stats[r]->snapshot().at(dist::CommKind::all_gather, dist::Pass::forward).calls,
                    (shard + per_round - 1) / per_round)
              << "in rounds";
          // One step from 0 with lr 1: AdamW moves each weight by −g / (|g| + eps).
          const at::Tensor g = at::arange(elements, at::kDouble) * (P * (P + 1) / 2.0);
          EXPECT_TRUE(at::allclose(model[0].second, -g / (g.abs() + 1e-8), 1e-12, 0)) << "P=" << P << " rank " << r;
          got[r] = sharded.pieces().empty() ? at::Tensor()
                                            : sharded.piece(sharded.pieces()[0], ShardTensor::exp_avg).clone();
        },
        stats);
    // exp_avg after one step = 0.1 · the summed gradient: (1 + … + P) · index.
    const double ranks_sum = P * (P + 1) / 2.0;
    const int64_t shard = (elements + P - 1) / P;
    for (int r = 0; r < P; ++r) {
      const int64_t first = r * shard, n = std::min(shard, elements - first);
      ASSERT_EQ(got[r].numel(), n);
      EXPECT_TRUE(at::allclose(got[r], at::arange(first, first + n, at::kDouble) * (0.1 * ranks_sum), 1e-12, 0))
          << "P=" << P << " rank " << r;
    }
  }
}

// A shard longer than the update's slice goes through AdamW's arithmetic a slice at a
// time: the numbers of torch's AdamW on the summed gradient, bit for bit (each rank gives
// the same gradient, so the sum over 2 ranks is exactly 2g).
TEST(ShardedAdamW, UpdatesAShardASliceAtATime) {
  const int64_t elements = 2 * ShardedAdamW::kUpdateSlice + 12345;  // 1 rank: 3 slices; 2 ranks: 2 a rank
  const AdamWOptions adamw{0.05, 0.9, 0.95, 1e-8, 0.1};
  const at::Tensor start = at::linspace(-1.0, 1.0, elements, at::kDouble);
  auto grad = [&](int t) { return at::sin(at::arange(elements, at::kDouble) * (0.001 * (t + 1))); };
  for (int P : {1, 2}) {
    model::NamedParams ref = {{"big.weight", start.clone().requires_grad_(true)}};
    auto opt = make_adamw(ref, adamw);
    for (int t = 0; t < 3; ++t) {
      ref[0].second.mutable_grad() = grad(t) * P;
      opt->step();
    }
    std::vector<at::Tensor> got(P);
    std::vector<std::shared_ptr<dist::CommStats>> stats;
    run_gloo_ranks(
        P,
        [&](int r, dist::GroupPtr world) {
          model::NamedParams model = {{"big.weight", start.clone().requires_grad_(true)}};
          ShardedAdamW sharded(std::make_shared<parallel::ShardedModel>(model, at::kDouble, world), adamw);
          for (int t = 0; t < 3; ++t) {
            sharded.zero_grad();
            model[0].second.mutable_grad() = grad(t);
            sharded.step(0);
          }
          got[r] = model[0].second.detach().clone();
        },
        stats);
    for (int r = 0; r < P; ++r) EXPECT_TRUE(at::equal(got[r], ref[0].second.detach())) << "P=" << P << " rank " << r;
  }
}

TEST(ShardedAdamW, Bf16ModelWithFp32ShardedMasters) {
  // The model gets the masters rounded once; the reference rounds its fp32 result once.
  for (int P : {2, 3}) expect_sharded_equals_replicated(P, at::kBFloat16, at::kFloat, 1e-2);
}

TEST(ShardedAdamW, NonFiniteGradientNamesTheParameterOnEveryRank) {
  std::vector<std::string> errors(2);
  std::vector<std::shared_ptr<dist::CommStats>> stats;
  run_gloo_ranks(
      2,
      [&](int r, dist::GroupPtr world) {
        model::NamedParams model = odd_params(at::kDouble);
        ShardedAdamW sharded(std::make_shared<parallel::ShardedModel>(model, at::kDouble, world, 64), AdamWOptions{});
        const at::Tensor before = model[4].second.detach().clone();
        for (auto& [name, p] : model) p.mutable_grad() = at::ones_like(p);
        model[4].second.mutable_grad()[3][1] = std::nan("");
        errors[r] = error_of([&] { sharded.step(1.0); });
        EXPECT_TRUE(at::equal(model[4].second.detach(), before)) << "nothing is updated";
      },
      stats);
  for (int r = 0; r < 2; ++r) EXPECT_THAT(errors[r], HasSubstr("gradient norm is nan (not finite)")) << r;
  // p4 (11×2) lies in the second rank's shard of its bucket in one of them at least.
  EXPECT_THAT(errors[0] + errors[1], HasSubstr("\"p4\""));
}

TEST(ShardedAdamW, RefusesUnknownLevels) {
  EXPECT_EQ(parallel::parse_shard_level("optimizer"), parallel::ShardLevel::optimizer);
  EXPECT_EQ(parallel::parse_shard_level("gradients"), parallel::ShardLevel::gradients);
  EXPECT_EQ(parallel::parse_shard_level("parameters"), parallel::ShardLevel::parameters);
  EXPECT_THAT(error_of([] { parallel::parse_shard_level("weights"); }),
              HasSubstr("--shard \"weights\" is unknown; use none, optimizer (ZeRO-1), gradients (ZeRO-2) or "
                        "parameters (ZeRO-3)"));
}

}  // namespace
}  // namespace mmsp::train
