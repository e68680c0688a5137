// `mmsp bench experts`; see experts_bench.h.
#include "experts_bench.h"

#include <ATen/ATen.h>

#include <chrono>
#include <vector>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/config/config.h"
#include "mmsp/model/layers/moe_block.h"
#include "mmsp/model/layers/parameter_init.h"
#include "mmsp/parallel/expert_parallel.h"
#include "mmsp/train/train_options.h"

namespace mmsp::bench {

using nlohmann::json;

namespace {

// Every rank's value, in rank order.
std::vector<int64_t> every_rank(int64_t mine, const dist::Mesh& mesh) {
  const at::Tensor all = dist::all_gather_v(
      at::full({1}, mine, at::kLong), std::vector<int64_t>(static_cast<size_t>(mesh.world_size()), 1), mesh.world());
  return {all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel()};
}

}  // namespace

json bench_experts(const dist::RankEnv& env, const ExpertsBenchOptions& o) {
  model::ModelConfig config = model::load_model_config(o.model);
  model::MoeConfig& moe = config.text.moe;
  const int P = env.world_size;
  MMSP_CHECK(moe.any(), "--model ", o.model, " (", config.model_type, ") has no experts");
  MMSP_CHECK(o.tokens > 0, "--tokens ", o.tokens, " must be positive");
  model::set_expert_shard(moe, P, env.rank);  // names --expert and the rule when P does not split them
  const at::ScalarType dtype = train::parse_compute_dtype(o.dtype);
  const int64_t h = config.text.hidden_size, E = moe.num_experts, k = moe.num_experts_per_tok, T = o.tokens;
  const int64_t b = static_cast<int64_t>(c10::elementSize(dtype)), local = moe.local_experts();
  MMSP_CHECK(local >= k, "--model ", o.model, ": the skewed routing sends every pick to rank 0's first ", k,
             " experts, but a rank holds ", local);
  dist::MeshOptions mo;
  mo.timeout = std::chrono::seconds(600);
  const dist::Mesh mesh = dist::Mesh::connect(env, plan::Mesh{P, 1, 1, P}, mo);
  std::shared_ptr<model::SparseMoeBlock> block;
  {
    model::ParameterInitScope init(model::ParameterInit::uninitialised, dtype);
    block = std::make_shared<model::SparseMoeBlock>(config.text);
  }
  at::manual_seed(1234 + env.rank);
  {
    at::NoGradGuard no_grad;
    for (auto& p : block->parameters()) p.normal_(0, 0.02);
  }
  // Every rank's router the same (the model's replicas are).
  at::manual_seed(99);
  const at::Tensor router = at::randn({E, h}) * 0.02;
  const model::ExpertExchange exchange = parallel::expert_exchange(mesh.expert());
  json rows = json::array();
  for (const char* routing : {"uniform", "skewed"}) {
    const bool skewed = std::string(routing) == "skewed";
    {
      at::NoGradGuard no_grad;
      at::Tensor w = router.clone();
      if (skewed) w.narrow(0, 0, k).add_(0.05);  // with inputs of mean 1: logits about 0.05 · h above the rest
      block->gate->weight.copy_(w);
    }
    at::manual_seed(7 + env.rank);
    const at::Tensor x = (at::randn({T, h}) + (skewed ? 1.0 : 0.0)).to(dtype).requires_grad_();
    // The exchange as the model calls it, counting the rows that cross: sent out, and come in.
    int64_t sent_rows = 0, received_rows = 0;
    model::MoeStep step;
    step.real = at::ones({T}, at::kBool);
    step.exchange.ranks = P;
    step.exchange.run = [&](const at::Tensor& r, const std::vector<int64_t>& counts,
                            const model::LocalExperts& experts) {
      for (int d = 0; d < P; ++d)
        for (int64_t j = 0; j < local; ++j) sent_rows += d == env.rank ? 0 : counts[d * local + j];
      const model::LocalExperts counted = [&](const at::Tensor& got, const std::vector<int64_t>& c) {
        for (int s = 0; s < P; ++s)
          for (int64_t j = 0; j < local; ++j) received_rows += s == env.rank ? 0 : c[s * local + j];
        return experts(got, c);
      };
      return exchange.run(r, counts, counted);
    };
    const dist::CommSnapshot before = mesh.stats().snapshot(plan::MeshAxis::expert);
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor y = block->forward(x, step, 0);
    const int64_t forward = (mesh.stats().snapshot(plan::MeshAxis::expert) - before).total_bytes();
    y.to(at::kFloat).square().sum().backward();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t sent = (mesh.stats().snapshot(plan::MeshAxis::expert) - before).total_bytes();
    const int64_t counts_bytes = 8 * (P - 1) * local;
    const int64_t exact = 2 * (sent_rows + received_rows) * h * b + counts_bytes;
    const int64_t uniform = 2 * parallel::expert_exchange_bytes(T, k, h, b, E, P) - counts_bytes;
    const std::vector<int64_t> all_sent = every_rank(sent, mesh), all_exact = every_rank(exact, mesh),
                               all_forward = every_rank(forward, mesh), all_in = every_rank(received_rows, mesh);
    int64_t busiest = 0, total_in = 0;
    for (int r = 0; r < P; ++r) {
      busiest = std::max(busiest, all_in[r]);
      total_in += all_in[r];
    }
    rows.push_back({{"routing", routing},
                    {"sent_bytes_per_rank", all_sent},
                    {"forward_bytes_per_rank", all_forward},
                    {"exact_formula_bytes_per_rank", all_exact},
                    {"uniform_formula_bytes", uniform},
                    {"rows_received_per_rank", all_in},
                    {"busiest_over_mean_received", total_in > 0 ? busiest * P / static_cast<double>(total_in) : 1.0},
                    {"seconds", seconds}});
  }
  return {{"bench", "experts"},
          {"model", o.model},
          {"ranks", P},
          {"expert", P},
          {"tokens_per_rank", T},
          {"hidden", h},
          {"experts", E},
          {"top_k", k},
          {"dtype", o.dtype},
          {"element_bytes", b},
          {"note", "bytes of one sparse layer, forward and backward, over the expert group"},
          {"rows", rows}};
}

}  // namespace mmsp::bench
