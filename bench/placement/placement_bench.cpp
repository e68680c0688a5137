// Zigzag vs adaptive placement, planned figures; see placement_bench.h.
// Workloads (seeded, deterministic):
//   sft:  text documents, log-normal lengths (median 800 tokens, sigma 1.0, 16..32768): an
//         SFT-like mix (not MagiAttention's published histogram);
//   vlm:  Qwen2-VL packs: captions and image questions (20..400 text tokens around 1..4
//         images of 64..1,024 rows) and one sequence in 20 a video of 4..64 frames of
//         64..576 rows (up to tens of thousands of tokens);
//   long: one text sequence of all the step's tokens.
#include "placement_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/model/family.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::bench {
namespace {

using namespace mmsp::plan;

void text(Sequence& s, int64_t n, std::mt19937& rng) {
  for (int64_t i = 0; i < n; ++i) s.input_ids.push_back(100 + static_cast<int64_t>(rng() % 900));
}

int64_t total_tokens(const Batch& b) {
  int64_t n = 0;
  for (const Sequence& s : b.sequences) n += static_cast<int64_t>(s.input_ids.size());
  return n;
}

Batch sft_batch(int64_t tokens, std::mt19937& rng) {
  std::lognormal_distribution<double> length(std::log(800.0), 1.0);
  Batch b;
  for (int64_t held = 0; held < tokens;) {
    const int64_t n = std::min(std::clamp<int64_t>(std::llround(length(rng)), 16, 32768), tokens - held);
    Sequence s;
    text(s, n, rng);
    held += n;
    b.sequences.push_back(std::move(s));
  }
  return b;
}

void vision_block(Sequence& s, const ModelConventions& c, int64_t pad, int64_t rows) {
  s.input_ids.push_back(c.vision_start_token_id);
  s.input_ids.insert(s.input_ids.end(), rows, pad);
  s.input_ids.push_back(c.vision_end_token_id);
}

Batch vlm_batch(int64_t tokens, const ModelConventions& c, std::mt19937& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Batch b;
  while (total_tokens(b) < tokens) {
    Sequence s;
    text(s, uniform(20, 200), rng);
    if (uniform(0, 19) == 0) {  // a video: frames x (h/2) x (w/2) rows
      const Grid g{uniform(2, 32) * 2, 2 * uniform(8, 24), 2 * uniform(8, 24)};
      s.video_grid_thw.push_back(g);
      vision_block(s, c, c.video_token_id, g[0] * (g[1] / 2) * (g[2] / 2));
    } else {
      const int64_t images = uniform(0, 3) == 0 ? uniform(2, 4) : 1;  // one in four: several
      for (int64_t i = 0; i < images; ++i) {
        const Grid g{1, 2 * uniform(8, 32), 2 * uniform(8, 32)};
        s.image_grid_thw.push_back(g);
        vision_block(s, c, c.image_token_id, (g[1] / 2) * (g[2] / 2));
        text(s, uniform(0, 40), rng);
      }
    }
    text(s, uniform(10, 200), rng);
    b.sequences.push_back(std::move(s));
  }
  return b;
}

Batch long_batch(int64_t tokens, std::mt19937& rng) {
  Batch b;
  b.sequences.emplace_back();
  text(b.sequences[0], tokens, rng);
  return b;
}

nlohmann::json row_figures(const RowPlan& row) {
  const LoadReport& l = row.load;
  double bytes_max = 0;
  for (size_t c = 0; c < l.tokens.size(); ++c) bytes_max = std::max(bytes_max, l.ulysses_bytes[c] + l.ring_bytes[c]);
  const double real = static_cast<double>(row.packing.real_tokens);
  int64_t split = 0, longest_whole = 0;
  for (const Segment& seg : row.packing.segments) {
    if (seg.home < 0)
      split += seg.length;
    else
      longest_whole = std::max(longest_whole, seg.length);
  }
  return {{"split_token_fraction", static_cast<double>(split) / real},
          {"longest_whole", longest_whole},
          {"attention_bytes", l.attention_bytes_total()},
          {"attention_bytes_rank_max", bytes_max},
          {"padding", l.padding_total()},
          {"padding_fraction", static_cast<double>(l.padding_total()) / real},
          {"tokens_max_over_mean", l.tokens_ratio},
          {"work_max_over_mean", l.pairs_ratio},
          {"whole_segments", l.whole_segments},
          {"split_segments", l.split_segments},
          {"local_length", row.shards.local_length()}};
}

double median_ms(const Batch& batch, const ModelConventions& c, const PlanOptions& o, int repeats) {
  std::vector<double> ms;
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepPlan plan = make_step_plan(batch, c, o, 37 % o.mesh.world());
    const auto t1 = std::chrono::steady_clock::now();
    if (plan.mine.local_length < 0) std::abort();  // keeps the plan alive
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

std::vector<PlacementWorkload> placement_workloads(int64_t tokens, const ModelConventions& c) {
  std::mt19937 rng(13);
  std::vector<PlacementWorkload> w;
  w.push_back({"sft", sft_batch(tokens, rng)});
  w.push_back({"vlm", vlm_batch(tokens, c, rng)});
  w.push_back({"long", long_batch(tokens, rng)});
  return w;
}

std::vector<std::string> write_placement_data(const std::string& dir, int64_t tokens) {
  std::vector<std::string> files;
  const ModelConventions qwen2_vl = model::conventions_from_config(nlohmann::json{{"model_type", "qwen2_vl"}});
  for (const PlacementWorkload& w : placement_workloads(tokens, qwen2_vl)) {
    if (std::string(w.name) == "vlm") continue;  // its placeholders would need pixels
    const std::string path = dir + "/" + w.name + ".jsonl";
    std::ofstream out(path);
    MMSP_CHECK(out.good(), "cannot write ", path);
    for (const Sequence& s : w.batch.sequences) out << nlohmann::json{{"input_ids", s.input_ids}}.dump() << "\n";
    MMSP_CHECK(out.good(), "writing ", path, " failed");
    files.push_back(path);
  }
  return files;
}

// 2 -> R2, 4 -> R2 U2, 8 -> R2 U4, 16 -> R2 U8, 32 -> R4 U8, 64 -> R8 U8.
Mesh placement_mesh(int ranks) {
  const int U = ranks <= 2 ? 1 : std::min(8, ranks / 2);
  return {1, ranks / U, U};
}

nlohmann::json bench_placement(const PlacementBenchOptions& options) {
  const ModelConventions c = model::conventions_from_config(nlohmann::json{{"model_type", "qwen2_vl"}});
  nlohmann::json rows = nlohmann::json::array();
  for (int ranks : options.ranks) {
    for (PlacementWorkload& w : placement_workloads(options.tokens_per_rank * ranks, c)) {
      PlanOptions o;
      o.mesh = placement_mesh(ranks);
      o.attention_shape = options.shape;
      nlohmann::json row = {{"workload", w.name},
                            {"ranks", ranks},
                            {"ring", o.mesh.ring},
                            {"ulysses", o.mesh.ulysses},
                            {"tokens", total_tokens(w.batch)},
                            {"sequences", w.batch.sequences.size()}};
      for (Placement p : {Placement::zigzag, Placement::adaptive}) {
        o.placement = p;
        row[to_string(p)] = row_figures(make_step_plan(w.batch, c, o, 0).rows[0]);
      }
      const double z = row["zigzag"]["attention_bytes"], a = row["adaptive"]["attention_bytes"];
      row["bytes_adaptive_over_zigzag"] = z > 0 ? a / z : 1.0;
      rows.push_back(row);
    }
  }
  // Planning time: one rank's whole plan of 1,000,000 tokens over R 8 x U 8.
  nlohmann::json timing = nlohmann::json::array();
  for (PlacementWorkload& w : placement_workloads(1000000, c)) {
    PlanOptions o;
    o.mesh = {1, 8, 8};
    for (Placement p : {Placement::zigzag, Placement::adaptive}) {
      o.placement = p;
      timing.push_back({{"workload", w.name},
                        {"tokens", total_tokens(w.batch)},
                        {"sequences", w.batch.sequences.size()},
                        {"ranks", 64},
                        {"placement", to_string(p)},
                        {"plan_ms", median_ms(w.batch, c, o, options.timing_repeats)}});
    }
  }
  const plan::AttentionShape& s = options.shape;
  return {{"planned_only", true},
          {"tokens_per_rank", options.tokens_per_rank},
          {"attention_shape",
           {{"heads", s.heads},
            {"kv_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"element_bytes", s.element_bytes},
            {"layers", s.layers}}},
          {"rows", rows},
          {"planning_time", timing}};
}

std::string placement_table(const nlohmann::json& result) {
  std::ostringstream out;
  char line[512];
  out << "| workload | ranks (R x U) | bytes/step zigzag | adaptive | ratio | padding zigzag | adaptive | "
         "work max/mean z | a | tokens max/mean z | a | whole / split |\n"
      << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& r : result["rows"]) {
    const auto &z = r["zigzag"], &a = r["adaptive"];
    std::snprintf(line, sizeof line,
                  "| %s | %d (%d x %d) | %.3g GB | %.3g GB | %.3f | %.2f %% | %.2f %% | %.3f | %.3f | %.3f | %.3f | "
                  "%lld / %lld |\n",
                  r["workload"].get<std::string>().c_str(), r["ranks"].get<int>(), r["ring"].get<int>(),
                  r["ulysses"].get<int>(), z["attention_bytes"].get<double>() / 1e9,
                  a["attention_bytes"].get<double>() / 1e9, r["bytes_adaptive_over_zigzag"].get<double>(),
                  100 * z["padding_fraction"].get<double>(), 100 * a["padding_fraction"].get<double>(),
                  z["work_max_over_mean"].get<double>(), a["work_max_over_mean"].get<double>(),
                  z["tokens_max_over_mean"].get<double>(), a["tokens_max_over_mean"].get<double>(),
                  a["whole_segments"].get<long long>(), a["split_segments"].get<long long>());
    out << line;
  }
  out << "\n| workload | tokens | sequences | plan zigzag | plan adaptive |\n| --- | --- | --- | --- | --- |\n";
  const auto& t = result["planning_time"];
  for (size_t i = 0; i + 1 < t.size(); i += 2) {
    std::snprintf(line, sizeof line, "| %s | %lld | %lld | %.2f ms | %.2f ms |\n",
                  t[i]["workload"].get<std::string>().c_str(), t[i]["tokens"].get<long long>(),
                  t[i]["sequences"].get<long long>(), t[i]["plan_ms"].get<double>(), t[i + 1]["plan_ms"].get<double>());
    out << line;
  }
  return out.str();
}

}  // namespace mmsp::bench
