// `mmsp logprobs`; see logprobs_command.h and mmsp/train/logprobs.h.
#include "logprobs_command.h"

#include <iostream>
#include <memory>

#include "mesh_options.h"
#include "mmsp/train/logprobs.h"
#include "mmsp/train/run_checks.h"
#include "train_command.h"
#include "train_flags.h"

namespace mmsp::cli {
namespace {

// The train flags a forward reads (the model, the data, how a step is cut and its
// numerics, the memory knobs), bound to a TrainFlags so that they parse as `mmsp train`'s.
void add_flags(CLI::App& app, TrainFlags& t, train::LogprobsOptions& l) {
  train::TrainOptions& o = t.options;
  app.add_option("--model", o.inputs.model,
                 "built-in model name, a Hugging Face model directory (its weights) or a config.json (random "
                 "weights from --seed)")
      ->required();
  app.add_option("--data", o.inputs.data, "the JSON-lines file (docs/data.md): every sample, in file order")
      ->required();
  app.add_option("--out", l.out, "the JSON-lines file to write: one line per sample (docs/rl.md)")->required();
  app.add_option("--temperature", l.temperature, "the logits are divided by it before the softmax (> 0)")
      ->capture_default_str();
  app.add_flag("--entropy", l.entropy, "also the entropy of each labelled token's distribution");
  app.add_option("--tokens-per-rank", o.inputs.tokens_per_rank,
                 "tokens per rank and step (a step holds at most this × world tokens; the longest sample must fit "
                 "a row)")
      ->capture_default_str();
  app.add_option("--data-rows", o.inputs.data_rows, "pack each step for this many dp rows (default: --dp)")
      ->capture_default_str();
  app.add_option("--dtype", t.dtype, "float32, float64 or bfloat16")->capture_default_str();
  app.add_option("--seed", o.inputs.seed, "the random weights of a config.json model")->capture_default_str();
  app.add_option("--max-image-pixels", o.inputs.max_image_pixels, "refuse image files larger than this")
      ->capture_default_str();
  app.add_option("--vision", t.vision, "routed, gather or replicate")->capture_default_str();
  app.add_option("--layout", t.layout, "zigzag or contiguous")->capture_default_str();
  app.add_option("--placement", t.placement, "zigzag or adaptive")->capture_default_str();
  app.add_option("--vision-split", t.vision_split, "auto, off or a patch count (as mmsp train)")->capture_default_str();
  app.add_option("--attention-block", o.parallel.attention_block, "query/key block of the attention kernel")
      ->capture_default_str();
  app.add_option("--attention-kernel", t.attention_kernel, "auto | fused | cudnn | blockwise (as mmsp train)")
      ->capture_default_str();
  app.add_option("--loss-chunk", o.memory.loss_chunk,
                 "tokens per chunk of the LM head (0: as many as fit 256 MiB of fp32 logits)")
      ->capture_default_str();
  app.add_option("--tiled-mlp", t.tiled_mlp, "off, auto or N tokens per MLP tile (as mmsp train)")
      ->capture_default_str();
  app.add_option("--shard", t.shard, "none, or parameters: the weights row- and layer-sharded over the ranks")
      ->capture_default_str();
  app.add_option("--memory-limit", t.memory_limit, "stop before allocating if the per-rank estimate exceeds this")
      ->capture_default_str();
}

int run_logprobs(const MeshFlags& flags, TrainFlags& train_flags, train::LogprobsOptions& l) {
  const dist::RankEnv env = dist::rank_env_from(dist::process_environment());
  train_flags.options.inputs.shuffle = false;  // file order
  train_flags.parse();
  const dist::RankDevice rank_device = flags.rank_device(env);
  train_flags.place(env, rank_device.device);
  train::TrainOptions& o = train_flags.options;
  const plan::Mesh shape = flags.shape(env.world_size);
  // Every check that needs no peer, on every rank, before the rendezvous.
  train::check_logprobs_options(l, o);
  train::check_train_options(o, shape);
  dist::AgreedFlags agreed = train::agreed_flags(o);
  agreed.push_back({"--out (logprobs)", l.out});
  agreed.push_back({"--temperature", dist::exact_number(l.temperature)});
  agreed.push_back({"--entropy", l.entropy ? "yes" : "no"});
  dist::Mesh mesh = dist::Mesh::connect(env, shape, flags.options(agreed, rank_device));
  auto activity = std::make_shared<dist::RankActivity>();
  const auto heartbeat = flags.start_heartbeat(env, mesh, activity);
  try {
    activity->set_phase("logprobs");
    train::write_logprobs(o, l, mesh, std::cout);
  } catch (const std::exception& e) { return report_failure("logprobs", e, o, heartbeat.get()); }
  return 0;
}

}  // namespace

Subcommand add_logprobs_command(CLI::App& parent) {
  auto mesh = std::make_shared<MeshFlags>();
  auto flags = std::make_shared<TrainFlags>();
  auto options = std::make_shared<train::LogprobsOptions>();
  CLI::App* app = parent.add_subcommand(
      "logprobs", "per-token log-probabilities (and entropy) of a .jsonl's labelled tokens, on the mesh");
  mesh->add_to(*app);
  add_flags(*app, *flags, *options);
  return {app, [mesh, flags, options]() { return run_logprobs(*mesh, *flags, *options); }};
}

}  // namespace mmsp::cli
