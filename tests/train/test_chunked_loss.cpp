// The chunked LM head + loss against the whole-logits one (train::causal_lm_loss of
// hidden · weightᵀ), fp64: the loss and the gradients of the hidden states and of the
// head weight, untied and tied to the embedding (whose rows also feed the hidden
// states), for chunks of 1 token, 7 (the last one partial) and all tokens.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "mmsp/core/check.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "mmsp/train/loss/chunked_loss.h"

namespace mmsp::train {
namespace {

constexpr int64_t T = 23, H = 8, V = 31;

struct Grads {
  at::Tensor loss, embedding, head;
};

// Embedding rows of `ids` through a small nonlinearity give the hidden states; the head
// is `head`, or the embedding itself when tied. Labels: a third are -100.
Grads run(bool tied, int64_t chunk) {
  at::manual_seed(3);
  const at::Tensor embedding = at::randn({V, H}, at::kDouble).requires_grad_();
  const at::Tensor head = at::randn({V, H}, at::kDouble).requires_grad_();
  const at::Tensor ids = at::randint(V, {T}, at::kLong);
  at::Tensor labels = at::randint(V, {T}, at::kLong);
  labels.index_put_({at::arange(0, T, 3)}, -100);
  const int64_t label_count = (labels != -100).sum().item<int64_t>() + 5;  // as if other ranks held 5 more
  const at::Tensor hidden = at::tanh(embedding.index_select(0, ids)) * 3;
  const at::Tensor& w = tied ? embedding : head;
  const at::Tensor loss = chunk == 0 ? train::causal_lm_loss(at::linear(hidden, w), labels, label_count)
                                     : chunked_lm_loss(hidden, w, labels, label_count, chunk);
  const auto g = torch::autograd::grad({loss * 1.7}, {embedding, head}, {}, false, false, true);
  return {loss.detach(), g[0], g[1]};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const char* what) {
  if (!want.defined()) {
    EXPECT_FALSE(got.defined()) << what;
    return;
  }
  ASSERT_TRUE(got.defined()) << what;
  const double diff = (got - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
  EXPECT_LE(diff, 1e-12 * scale) << what << ": max difference " << diff << " of " << scale;
  EXPECT_GT(scale, 0) << what;
}

TEST(ChunkedLoss, EqualsTheWholeLogitsLossInValueAndGradient) {
  for (bool tied : {false, true}) {
    const Grads ref = run(tied, 0);
    for (int64_t chunk : {int64_t{1}, int64_t{7}, T, T + 5}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + " chunk " + std::to_string(chunk));
      const Grads got = run(tied, chunk);
      expect_close(got.loss, ref.loss, "loss");
      expect_close(got.embedding, ref.embedding, "embedding gradient");
      expect_close(got.head, ref.head, "head gradient");
    }
  }
}

TEST(ChunkedLoss, Bf16ComputesInFp32AndReturnsBf16Gradients) {
  at::manual_seed(4);
  const at::Tensor hidden = at::randn({T, H}).to(at::kBFloat16).requires_grad_();
  const at::Tensor weight = at::randn({V, H}).to(at::kBFloat16).requires_grad_();
  const at::Tensor labels = at::randint(V, {T}, at::kLong);
  const at::Tensor loss = chunked_lm_loss(hidden, weight, labels, T, 7);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  const at::Tensor ref = train::causal_lm_loss(at::linear(hidden, weight), labels, T);
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * ref.item<double>());
  loss.backward();
  EXPECT_EQ(hidden.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(weight.grad().scalar_type(), at::kBFloat16);
  // The gradients are the fp32 ones of the same bf16 inputs, rounded once.
  const at::Tensor h32 = hidden.detach().to(at::kFloat).requires_grad_();
  const at::Tensor w32 = weight.detach().to(at::kFloat).requires_grad_();
  train::causal_lm_loss(at::linear(h32, w32), labels, T).backward();
  for (const auto& [got, want] : {std::pair{hidden.grad(), h32.grad()}, std::pair{weight.grad(), w32.grad()}}) {
    const double diff = (got.to(at::kFloat) - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
    EXPECT_LE(diff, 1e-2 * scale) << "max difference " << diff << " of " << scale;
  }
}

// A frozen head (LoRA, --freeze llm): the hidden state's gradient is the trained head's,
// and the head gets none (no [V, h] gradient is made).
TEST(ChunkedLoss, AFrozenHeadGetsNoGradientAndTheSameHiddenGradient) {
  at::manual_seed(5);
  const at::Tensor weight = at::randn({V, H}, at::kDouble);
  const at::Tensor labels = at::randint(V, {T}, at::kLong);
  const at::Tensor frozen_in = at::randn({T, H}, at::kDouble).requires_grad_();
  const at::Tensor trained_in = frozen_in.detach().clone().requires_grad_();
  const at::Tensor trained = weight.clone().requires_grad_();
  chunked_lm_loss(frozen_in, weight, labels, T, 7).backward();
  chunked_lm_loss(trained_in, trained, labels, T, 7).backward();
  EXPECT_FALSE(weight.grad().defined());
  EXPECT_TRUE(trained.grad().defined());
  EXPECT_TRUE(at::equal(frozen_in.grad(), trained_in.grad()));
}

TEST(ChunkedLoss, DefaultChunkHoldsAtMost256MiBOfFp32Logits) {
  EXPECT_EQ(default_loss_chunk(151936), 441);  // floor(2^28 / (4 · 151936))
  EXPECT_LE(default_loss_chunk(248320) * 248320 * 4, int64_t{256} << 20);
  EXPECT_GT((default_loss_chunk(248320) + 1) * 248320 * 4, int64_t{256} << 20);
  EXPECT_EQ(default_loss_chunk(int64_t{1} << 40), 1);  // at least one token
}

// The per-token label log-probabilities and entropies at a temperature (an RL objective's
// values, chunked_label_values) against log_softmax(hidden · weightᵀ / T) whole: values, and
// the gradients of hidden and head of a loss that weighs each token's two values by its own
// coefficients (so every token's softmax and entropy terms count), in blocks of 1, 7 and
// all tokens; chunked_label_logprobs is its first row, and its gradient too.
TEST(ChunkedLoss, LabelValuesAndTheirGradientsEqualTheWholeLogits) {
  at::manual_seed(5);
  const double temperature = 0.7;
  const at::Tensor hidden = (at::randn({T, H}, at::kDouble) * 2).requires_grad_();
  const at::Tensor head = at::randn({V, H}, at::kDouble).requires_grad_();
  at::Tensor labels = at::randint(V, {T}, at::kLong);
  labels.index_put_({at::arange(0, T, 4)}, -100);
  const at::Tensor a = at::randn({T}, at::kDouble), b = at::randn({T}, at::kDouble);
  const at::Tensor logp = at::log_softmax(at::linear(hidden, head) / temperature, 1);
  const at::Tensor labelled = labels != -100;
  const at::Tensor ref_lp = at::where(labelled, logp.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1), 0.0);
  const at::Tensor ref_entropy = -(logp.exp() * logp).sum(1);
  const auto ref = torch::autograd::grad({(a * ref_lp + b * ref_entropy).sum()}, {hidden, head}, {}, true);
  const auto ref_lp_only = torch::autograd::grad({(a * ref_lp).sum()}, {hidden, head}, {}, true);
  for (int64_t chunk : {int64_t{1}, int64_t{7}, T}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const at::Tensor values = chunked_label_values(hidden, head, labels, temperature, chunk);
    expect_close(values[0], ref_lp, "log-probabilities");
    expect_close(values[1], ref_entropy, "entropies");
    const auto got = torch::autograd::grad({(a * values[0] + b * values[1]).sum()}, {hidden, head});
    expect_close(got[0], ref[0], "hidden gradient");
    expect_close(got[1], ref[1], "head gradient");
    const at::Tensor lp = chunked_label_logprobs(hidden, head, labels, temperature, chunk);
    expect_close(lp, ref_lp, "chunked_label_logprobs");
    const auto got_lp = torch::autograd::grad({(a * lp).sum()}, {hidden, head});
    expect_close(got_lp[0], ref_lp_only[0], "chunked_label_logprobs' hidden gradient");
    expect_close(got_lp[1], ref_lp_only[1], "chunked_label_logprobs' head gradient");
  }
}

TEST(ChunkedLoss, BadChunkOrShapesAreErrorsNamingTheValue) {
  const at::Tensor hidden = at::zeros({4, H}), weight = at::zeros({V, H});
  const at::Tensor labels = at::zeros({4}, at::kLong);
  try {
    chunked_lm_loss(hidden, weight, labels, 4, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--loss-chunk 0 must be positive"), std::string::npos) << e.what();
  }
  EXPECT_THROW(chunked_lm_loss(hidden, at::zeros({V, H + 1}), labels, 4, 2), Error);
  EXPECT_THROW(chunked_lm_loss(hidden, weight, at::zeros({5}, at::kLong), 4, 2), Error);
  EXPECT_THROW(chunked_lm_loss(hidden, weight, labels, 0, 2), Error);
}

}  // namespace
}  // namespace mmsp::train
