// `mmsp plan --config config.json --batch batch.json --dp D --ring R --ulysses U
//  [--layout zigzag|contiguous] [--placement zigzag|adaptive] [--vision-split auto|off|N] [--rank K] [--format
//  text|json]`:
// builds the StepPlan exactly as every rank would and prints it; the text form also sets
// zigzag and adaptive placement side by side. Uses only mmsp_plan, CLI11 and nlohmann_json.
#include "plan_command.h"

#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mesh_size_flags.h"
#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"
#include "mmsp/model/family.h"
#include "mmsp/plan/plan_json.h"
#include "mmsp/plan/step_plan.h"

namespace mmsp::cli {

namespace {

struct PlanFlags {
  std::string config;
  std::string batch;
  MeshSizeFlags mesh{/*infer_fastest=*/false};  // --dp --ring --ulysses --expert
  int world = -1;                               // when given, must equal dp * ring * ulysses
  std::string layout = "zigzag";
  std::string placement = "zigzag";
  std::string vision_split = "auto";  // as mmsp train
  int rank = -1;                      // -1: every rank
  std::string format = "text";
  int indent = -1;
};

nlohmann::json read_json(const std::string& path, const char* what) {
  MMSP_CHECK(std::ifstream(path).good(), "cannot read ", what, " file \"", path, "\"");
  return read_json_file(path);
}

std::string rank_line(const plan::StepPlan& plan, const plan::RankPlan& rp) {
  int64_t real = 0, labels = 0, sent = 0, received = 0;
  for (int64_t t : rp.tokens) real += t >= 0;
  for (int64_t l : rp.labels) labels += l != plan::kIgnoreIndex;
  for (const auto& v : rp.routes.send) sent += static_cast<int64_t>(v.size());
  for (const auto& v : rp.routes.recv) received += static_cast<int64_t>(v.size());
  std::ostringstream out;
  out << "rank " << rp.rank << " (dp " << rp.coords.dp << ", ring " << rp.coords.ring << ", ulysses "
      << rp.coords.ulysses << "): " << rp.local_length << " slots, " << real << " tokens, " << labels
      << " labels, encodes " << rp.routes.encoder_items.size() << " vision items (" << rp.routes.encoder_rows
      << " rows), sends " << sent << " rows, receives " << received << " rows onto " << rp.routes.visual_slots.size()
      << " visual slots\n";
  return out.str();
}

// vocab_size of the config (top level, else text_config), or -1 when it gives none.
int64_t vocab_size(const nlohmann::json& config) {
  for (const nlohmann::json* j : {&config, config.contains("text_config") ? &config.at("text_config") : nullptr}) {
    if (j == nullptr || !j->is_object() || !j->contains("vocab_size") || j->at("vocab_size").is_null()) continue;
    const auto& v = j->at("vocab_size");
    MMSP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, "config.json: vocab_size must be an integer >= 1, got ",
               v.dump());
    return v.get<int64_t>();
  }
  return -1;
}

void check_token_ids(const plan::Batch& batch, int64_t vocab, const std::string& batch_path,
                     const std::string& config) {
  if (vocab < 0) return;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const auto& ids = batch.sequences[s].input_ids;
    for (size_t k = 0; k < ids.size(); ++k)
      MMSP_CHECK(ids[k] < vocab, batch_path, ": sequence ", s, ": input_ids[", k, "] = ", ids[k],
                 " is outside the vocabulary 0..", vocab - 1, " of ", config);
  }
}

// The config's own vision token ids against the vocabulary it declares.
void check_special_ids(const plan::ModelConventions& c, int64_t vocab, const std::string& config) {
  if (vocab < 0) return;
  const std::pair<const char*, int64_t> ids[] = {{"image token id", c.image_token_id},
                                                 {"video token id", c.video_token_id},
                                                 {"vision start token id", c.vision_start_token_id},
                                                 {"vision end token id", c.vision_end_token_id}};
  for (const auto& [what, id] : ids)
    MMSP_CHECK(id < vocab, config, ": the ", what, " ", id, " is outside the vocabulary 0..", vocab - 1,
               " that vocab_size declares");
}

int run_plan(const PlanFlags& f) {
  try {
    MMSP_CHECK(f.indent >= -1 && f.indent <= 16, "--indent ", f.indent, " must be in [-1, 16] (-1: compact)");
    MMSP_CHECK(f.rank >= -1, "--rank ", f.rank, " must be a rank >= 0 (or -1: every rank)");
    const nlohmann::json config = read_json(f.config, "--config");
    const plan::ModelConventions conventions = model::conventions_from_config(config);  // the family registry
    const plan::Batch batch = plan::batch_from_json(read_json(f.batch, "--batch"));
    // Only what planning uses is checked: transformers' defaults for what the config
    // leaves out (Qwen2-VL's hidden size 8192, LLaVA's vocab_size 32000) are not read.
    const int64_t vocab = vocab_size(config);
    check_special_ids(conventions, vocab, f.config);
    check_token_ids(batch, vocab, f.batch, f.config);
    plan::PlanOptions options;
    options.mesh = f.mesh.shape(-1);
    std::string priced;  // why the attention bytes are not the config's own, when they are not
    options.attention_shape = model::planned_attention_shape(config, f.config, priced);
    options.layout = plan::parse_layout(f.layout);
    options.placement = plan::parse_placement(f.placement);
    options.vision_split = plan::parse_vision_split(f.vision_split);
    plan::validate_mesh(options.mesh, f.world);
    MMSP_CHECK(f.format == "text" || f.format == "json", "--format \"", f.format, "\" is unknown; use text or json");
    const plan::StepPlan plan = plan::make_step_plan(batch, conventions, options, std::max(f.rank, 0));
    std::vector<int> ranks;
    if (f.rank >= 0)
      ranks.push_back(f.rank);
    else
      for (int r = 0; r < options.mesh.world(); ++r) ranks.push_back(r);
    if (f.format == "json") {
      std::cout << plan::step_plan_to_json(batch, plan, ranks).dump(f.indent) << "\n";
      return 0;
    }
    std::cout << plan::step_plan_summary(plan);
    if (!priced.empty()) std::cout << "note: " << priced << "\n";
    if (options.layout == plan::Layout::zigzag) {
      plan::PlanOptions other = options;
      other.placement =
          options.placement == plan::Placement::zigzag ? plan::Placement::adaptive : plan::Placement::zigzag;
      const plan::StepPlan second = plan::make_step_plan(batch, conventions, other, std::max(f.rank, 0));
      const bool zigzag_first = options.placement == plan::Placement::zigzag;
      std::cout << plan::placement_comparison(zigzag_first ? plan : second, zigzag_first ? second : plan);
    }
    for (int r : ranks) {
      const plan::RankPlan rp = r == plan.mine.rank ? plan.mine : plan::make_rank_plan(batch, plan, r);
      std::cout << rank_line(plan, rp);
    }
    return 0;
  } catch (const mmsp::Error& e) {
    std::cerr << "mmsp plan: error: " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace

Subcommand add_plan_command(CLI::App& parent) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* app = parent.add_subcommand(
      "plan", "print the step plan of a batch: packing, shards, positions, labels, Vision DP, routes");
  app->add_option("--config", flags->config, "Hugging Face config.json of the model")->required();
  app->add_option("--batch", flags->batch, "batch.json: {\"sequences\": [{\"input_ids\": ...}]}")->required();
  flags->mesh.add_to(*app);
  app->add_option("--world", flags->world, "world size to check dp * ring * ulysses against");
  app->add_option("--layout", flags->layout, "zigzag (default) or contiguous");
  app->add_option("--placement", flags->placement,
                  "zigzag (default: every segment split) or adaptive (short segments whole on one rank)");
  app->add_option("--vision-split", flags->vision_split,
                  "auto (default, as mmsp train), off, or a patch count: items encoded by the whole context group");
  app->add_option("--rank", flags->rank, "show only this rank (default: every rank)");
  app->add_option("--format", flags->format, "text (default) or json");
  app->add_option("--indent", flags->indent, "JSON indent (default: compact)");
  return {app, [flags] { return run_plan(*flags); }};
}

}  // namespace mmsp::cli
