// `mmsp bench logprobs`; see logprobs_bench.h.
#include "logprobs_bench.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/train/builtin_models.h"
#include "mmsp/train/loss/chunked_loss.h"
#include "mmsp/train/memory/memory_counter.h"

namespace mmsp::bench {

using nlohmann::json;

namespace {

// The busiest rank's figure (a max over the world).
double world_max(double mine, const dist::Mesh& mesh) {
  at::Tensor t = at::full({1}, mine, at::kDouble);
  const at::Tensor all =
      dist::all_gather_v(t, std::vector<int64_t>(static_cast<size_t>(mesh.world_size()), 1), mesh.world());
  return all.max().item<double>();
}

}  // namespace

json bench_logprobs(const dist::RankEnv& env, const LogprobsBenchOptions& o) {
  const model::ModelConfig config = train::resolve_model(o.model).config;
  const int64_t V = o.vocab > 0 ? o.vocab : config.text.vocab_size, h = config.text.hidden_size;
  const int P = env.world_size;
  MMSP_CHECK(o.tokens > 0 && o.tokens % P == 0, "--tokens ", o.tokens, " must be a positive multiple of the ", P,
             " ranks");
  const int64_t T = o.tokens, L = T / P;
  const int64_t chunk = o.loss_chunk > 0 ? o.loss_chunk : train::default_loss_chunk(V);
  dist::MeshOptions mo;
  mo.timeout = std::chrono::seconds(600);
  const dist::Mesh mesh = dist::Mesh::connect(env, plan::Mesh{1, P, 1}, mo);
  at::manual_seed(1234);  // the same head on every rank
  const at::Tensor weight = at::randn({V, h}) * 0.05;
  at::manual_seed(77 + mesh.rank());
  const at::Tensor hidden = at::randn({L, h}), labels = at::randint(V, {L}, at::TensorOptions().dtype(at::kLong));
  const std::vector<int64_t> counts(static_cast<size_t>(P), L);
  const at::Tensor all_labels = dist::all_gather_v(labels, counts, mesh.world());  // the sample's, on every rank
  at::NoGradGuard no_grad;

  // One way's row: `run` gives the T values on every rank (double); timed, peak and bytes measured.
  at::Tensor reference;
  json rows = json::array();
  auto measure = [&](const char* way, const char* what, int64_t formula_bytes, const std::function<at::Tensor()>& run) {
    train::MemoryCounter memory;
    const dist::CommSnapshot before = mesh.stats().snapshot();
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor values = run();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t sent = (mesh.stats().snapshot() - before).total_bytes();
    const double peak = world_max(static_cast<double>(memory.peak_bytes()), mesh);
    if (!reference.defined()) reference = values;
    rows.push_back({{"way", way},
                    {"what", what},
                    {"peak_bytes", static_cast<int64_t>(peak)},
                    {"sent_bytes", static_cast<int64_t>(world_max(static_cast<double>(sent), mesh))},
                    {"formula_sent_bytes", formula_bytes},
                    {"seconds", world_max(seconds, mesh)},
                    {"max_abs_diff_from_mmsp", (values - reference).abs().max().item<double>()}});
  };
  const int64_t d = 8, f = 4;  // bytes of a double value, of an fp32 logit
  measure("mmsp", "the head in blocks of vocabulary rows; one all-reduce of the T values",
          dist::all_reduce_bytes(T * d, P), [&] {
            const at::Tensor mine = train::chunked_token_values(hidden, weight, labels, 1.0, chunk)[0];
            at::Tensor flat = at::zeros({T}, at::kDouble);
            flat.narrow(0, mesh.rank() * L, L).copy_(mine);
            dist::all_reduce_(flat, *mesh.world());
            return flat;
          });
  measure("local-logits", "[T/P, V] logits whole on each rank, its values gathered (verl's way)", (P - 1) * L * d, [&] {
    const at::Tensor logp = at::log_softmax(at::linear(hidden, weight), 1);
    const at::Tensor mine = logp.gather(1, labels.unsqueeze(1)).squeeze(1).to(at::kDouble);
    return dist::all_gather_v(mine, counts, mesh.world());
  });
  measure("naive", "the logits gathered to [T, V] on every rank, then log_softmax", (P - 1) * L * V * f, [&] {
    const at::Tensor logits = dist::all_gather_v(at::linear(hidden, weight), counts, mesh.world());
    return at::log_softmax(logits, 1).gather(1, all_labels.unsqueeze(1)).squeeze(1).to(at::kDouble);
  });
  const json& mmsp = rows[0];
  const json& naive = rows[2];
  return {{"bench", "logprobs"},
          {"ranks", P},
          {"tokens", T},
          {"vocab", V},
          {"hidden", h},
          {"loss_chunk", chunk},
          {"rows", rows},
          {"naive_over_mmsp_peak", naive["peak_bytes"].get<double>() / mmsp["peak_bytes"].get<double>()},
          {"naive_over_mmsp_sent", naive["sent_bytes"].get<double>() / mmsp["sent_bytes"].get<double>()}};
}

}  // namespace mmsp::bench
