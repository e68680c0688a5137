// `mmsp train` and `mmsp compare-losses`; see train_command.h and docs/train.md.
#include "train_command.h"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "byte_size.h"
#include "mesh_options.h"
#include "mmsp/compat/quiet_c10_log.h"
#include "mmsp/core/check.h"
#include "mmsp/model/tiled_mlp.h"
#include "mmsp/train/checkpoint/run_directory.h"
#include "mmsp/train/memory/cuda_memory.h"
#include "mmsp/train/run_checks.h"
#include "mmsp/train/trainer.h"

namespace mmsp::cli {

Subcommand add_train_command(CLI::App& parent) {
  auto flags = std::make_shared<MeshFlags>();
  auto o = std::make_shared<train::TrainOptions>();
  auto vision = std::make_shared<std::string>("routed");
  auto layout = std::make_shared<std::string>("zigzag");
  auto placement = std::make_shared<std::string>("zigzag");
  auto vision_split = std::make_shared<std::string>("auto");
  auto save_shard_size = std::make_shared<std::string>("5GB");
  auto memory_limit = std::make_shared<std::string>("auto");
  auto checkpointing = std::make_shared<std::string>("none");
  auto tiled_mlp = std::make_shared<std::string>("off");
  CLI::App* app = parent.add_subcommand("train", "train a VLM with its sequences split across the ranks");
  flags->add_to(*app);
  app->add_option("--model", o->model, "built-in model name, a Hugging Face model directory (its weights) or a config.json (random weights)")->capture_default_str();
  app->add_option("--data", o->data, "'shapes' (built in) or a JSON-lines file (docs/data.md)")->capture_default_str();
  app->add_option("--vision", *vision, "routed, gather or replicate")->capture_default_str();
  app->add_option("--layout", *layout, "zigzag or contiguous")->capture_default_str();
  app->add_option("--placement", *placement,
                  "zigzag (every segment split over the context group) or adaptive (short ones whole on one rank)")
      ->capture_default_str();
  app->add_option("--vision-split", *vision_split,
                  "encode an image or video over the whole context group: auto (one costing more than a rank's "
                  "share, of at least 4096 patches), off, or a patch count (every item of at least that many)")
      ->capture_default_str();
  app->add_option("--steps", o->steps, "optimizer steps")->capture_default_str();
  app->add_option("--stop-after", o->stop_after, "stop after this step (checkpointed), resume later")
      ->capture_default_str();
  app->add_option("--tokens-per-rank", o->tokens_per_rank, "tokens per rank and step (a step holds at most this × world tokens)")
      ->capture_default_str();
  app->add_option("--data-rows", o->data_rows,
                  "pack each step for this many dp rows (default: --dp); same value, same batches on any mesh")
      ->capture_default_str();
  app->add_option("--dtype", o->dtype, "float32, float64 or bfloat16 (mixed: bf16 compute, fp32 master weights)")
      ->capture_default_str();
  app->add_option("--save-dtype", o->save_dtype,
                  "dtype of each checkpoint's hf/ directory (default: as the weights were loaded)");
  app->add_option("--save-shard-size", *save_shard_size, "largest safetensors shard of hf/ (e.g. 5GB, 500MB)")
      ->capture_default_str();
  app->add_option("--memory-limit", *memory_limit,
                  "stop before allocating if the per-rank estimate exceeds this (e.g. 20GiB; 0: off; "
                  "auto: available memory / ranks on this host)")
      ->capture_default_str();
  app->add_option("--lr", o->lr, "peak learning rate")->capture_default_str();
  app->add_option("--min-lr", o->min_lr, "learning rate at the end of the cosine")->capture_default_str();
  app->add_option("--warmup", o->warmup, "linear warm-up steps")->capture_default_str();
  app->add_option("--weight-decay", o->weight_decay, "AdamW weight decay (matrices only)")->capture_default_str();
  app->add_option("--clip", o->clip, "clip gradients to this global norm (0: off)")->capture_default_str();
  app->add_option("--shard", o->shard,
                  "none; optimizer: fp32 masters and AdamW moments split over every rank (ZeRO-1); "
                  "gradients: and the gradients (ZeRO-2); parameters: and the weights of the decoder layers, "
                  "LM head, embedding and vision blocks (ZeRO-3)")
      ->capture_default_str();
  app->add_option("--seed", o->seed, "parameters and data order")->capture_default_str();
  app->add_flag("!--no-shuffle", o->shuffle, "read samples in file order");
  app->add_option("--shapes-samples", o->shapes_samples, "samples per epoch of the shapes dataset")->capture_default_str();
  app->add_flag("--blank-images", o->blank_images, "shapes with constant images (the text-only baseline)");
  app->add_option("--max-image-pixels", o->max_image_pixels,
                  "refuse image files larger than this (width × height, read from the header at load)")
      ->capture_default_str();
  app->add_option("--attention-block", o->attention_block, "query/key block of the attention kernel")->capture_default_str();
  app->add_option("--attention-kernel", o->attention_kernel,
                  "auto | blockwise | fused: the local attention kernel (auto: FlashAttention-2 varlen on CUDA "
                  "where it serves, mmsp's blockwise kernel elsewhere)")
      ->capture_default_str();
  app->add_option("--loss-chunk", o->loss_chunk,
                  "tokens per chunk of the LM head and loss (0: as many as fit 256 MiB of fp32 logits)")
      ->capture_default_str();
  app->add_option("--checkpoint-activations", *checkpointing,
                  "none, decoder (recompute each decoder layer in the backward) or all (and each vision block)")
      ->capture_default_str();
  app->add_flag("--offload-activations", o->offload_activations,
                "keep the recomputed layers' inputs in host memory until their backward (needs "
                "--checkpoint-activations; on CUDA the copies overlap the compute)");
  app->add_option("--tiled-mlp", *tiled_mlp,
                  "off, auto (tiles of at most hidden-size tokens) or N: each decoder MLP runs over tiles of N "
                  "tokens, forward and backward, so its [tokens, intermediate] activations exist one tile at a time")
      ->capture_default_str();
  app->add_option("--out", o->out, "directory for metrics.jsonl and checkpoints");
  app->add_option("--checkpoint-every", o->checkpoint_every, "save every N steps (and at the end)")->capture_default_str();
  app->add_option("--keep", o->keep, "checkpoints to keep (0: all)")->capture_default_str();
  app->add_option("--resume", o->resume, "continue from this checkpoint or run directory");
  app->add_flag("--overwrite", o->overwrite,
                "start afresh in an --out that holds another run: its metrics and checkpoints are deleted first");
  app->add_option("--save-gradients", o->save_gradients,
                  "write the first step's gradients (summed over the ranks, before --clip) as a model directory "
                  "here, to compare with a reference (--shard none)");
  app->add_flag("--allow-changed-flags", o->allow_changed_flags,
                "resume although flags that change the batches or the numerics differ from the checkpoint's");
  app->add_flag("--quiet", o->quiet, "no per-step lines (the summary still prints)");
  // Hidden test hooks of the reliability tests (docs/reliability.md): "RANK:STEP:SECONDS", "RANK:STEP".
  auto test_sleep = std::make_shared<std::string>();
  auto test_skew = std::make_shared<std::string>();
  app->add_option("--test-sleep-in-step", *test_sleep)->group("");
  app->add_option("--test-skew-batch", *test_skew)->group("");
  return {app, [flags, o, vision, layout, placement, vision_split, save_shard_size, memory_limit, checkpointing, tiled_mlp, test_sleep, test_skew]() {
            if (!test_sleep->empty())
              MMSP_CHECK(std::sscanf(test_sleep->c_str(), "%d:%ld:%lf", &o->test.sleep_rank, &o->test.sleep_step,
                                     &o->test.sleep_seconds) == 3,
                         "--test-sleep-in-step '", *test_sleep, "' must be RANK:STEP:SECONDS");
            if (!test_skew->empty())
              MMSP_CHECK(std::sscanf(test_skew->c_str(), "%d:%ld", &o->test.skew_batch_rank,
                                     &o->test.skew_batch_step) == 2,
                         "--test-skew-batch '", *test_skew, "' must be RANK:STEP");
            // The crash test (tests/train/train_cli.sh) sets "STEP:BYTES" in the environment,
            // which mmsp-run hands to every rank: the save of step STEP dies after BYTES bytes.
            if (const char* crash = std::getenv("MMSP_TEST_CRASH_CHECKPOINT"))
              MMSP_CHECK(std::sscanf(crash, "%ld:%ld", &o->test.crash_checkpoint_step,
                                     &o->test.crash_checkpoint_after_bytes) == 2,
                         "MMSP_TEST_CRASH_CHECKPOINT '", crash, "' must be STEP:BYTES");
            if (const char* crash = std::getenv("MMSP_TEST_CRASH_IN_KEEP"))  // "STEP": see TestHooks
              MMSP_CHECK(std::sscanf(crash, "%ld", &o->test.crash_keep_step) == 1,
                         "MMSP_TEST_CRASH_IN_KEEP '", crash, "' must be a step");
            o->vision = model::parse_vision_mode(*vision);
            o->layout = plan::parse_layout(*layout);
            o->placement = plan::parse_placement(*placement);
            o->vision_split = plan::parse_vision_split(*vision_split);
            MMSP_CHECK(o->placement == plan::Placement::zigzag || o->layout == plan::Layout::zigzag,
                       "--placement adaptive splits long segments in zigzag order; it needs --layout zigzag, not ",
                       plan::to_string(o->layout));
            o->checkpoint_activations = model::parse_activation_checkpointing(*checkpointing);
            o->tiled_mlp = model::parse_mlp_tile(*tiled_mlp);
            o->save_shard_bytes = parse_byte_size(*save_shard_size, "--save-shard-size");
            const dist::RankEnv env = dist::rank_env_from(dist::process_environment());
            const dist::RankDevice rank_device = flags->rank_device(env);  // names a rank without its GPU
            o->device = rank_device.device;
            if (*memory_limit == "auto" && o->device.is_cuda()) {
              o->memory_limit_bytes = train::cuda_free_bytes(o->device.index());
              o->memory_limit_source = "the free memory of " + o->device.str();
            } else if (*memory_limit == "auto") {
              o->memory_limit_bytes = host_available_memory() / std::max(1, env.local_world_size);
              o->memory_limit_source = "this host's available memory divided by its " +
                                       std::to_string(env.local_world_size) + " rank(s)";
            } else {
              o->memory_limit_bytes = parse_byte_size(*memory_limit, "--memory-limit");
            }
            const plan::Mesh shape = flags->shape(env.world_size);
            train::check_train_options(*o, shape);
            train::probe_out_dir(o->out);  // every rank, before the rendezvous
            // Rank 0 writes --out and holds its lock for the run; a refusal reaches every
            // rank through the rendezvous (no rank waits for it until the timeout).
            dist::MeshOptions mesh_options = flags->options(train::agreed_flags(*o), rank_device);
            train::RunDirectoryLock out_lock;
            if (env.rank == 0) {
              try {
                out_lock = train::RunDirectoryLock::claim(o->out, o->resume, o->overwrite);
              } catch (const Error& e) {
                mesh_options.refusal = e.what();
              }
            }
            dist::Mesh mesh = dist::Mesh::connect(env, shape, mesh_options);
            if (env.rank == 0 && mesh.hosts().spans_hosts()) std::cout << "mmsp train: " << mesh.hosts().summary() << std::endl;
            auto activity = std::make_shared<dist::RankActivity>();
            const auto heartbeat = flags->start_heartbeat(env, mesh, activity);
            o->report_parameters = false;  // the checkpoint holds them; a copy per rank would not fit
            o->report_steps = false;       // metrics.jsonl holds them; the summary is folded as it goes
            try {
              train::check_out_shared(o->out, mesh);  // one --out for every host, or no rank starts
              train::train(*o, mesh, std::cout, activity.get());
            } catch (const std::exception& e) {
              // Said first (the launcher may stop this rank while rank 0 waits below),
              // then posted for the other ranks, which may sit in a collective.
              const bool ours = dynamic_cast<const Error*>(&e) != nullptr;
              std::string what = e.what();
              // c10's messages carry a C++ backtrace: the first line is the message.
              if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) what = c10->what_without_backtrace();
              const bool out_of_memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                                         dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                                         what.find("can't allocate memory") != std::string::npos;
              if (out_of_memory) {
                what = "out of memory on this rank (" + what.substr(0, what.find('\n')) + ")" +
                       (o->memory_limit_bytes == 0
                            ? ": --memory-limit 0 turned the memory preflight off; without it the run is checked "
                              "against this host's memory before anything is allocated, naming what does not fit"
                            : ": the preflight's estimate was below --memory-limit, so something it does not count "
                              "took the memory; lower --tokens-per-rank or use --shard / --checkpoint-activations");
              }
              // A collective that failed because a peer ended: the peer's reason first.
              // A hang this rank's heartbeat declared: the collective failed because the
              // others are ending on it. Its message and exit status come first.
              if (heartbeat) heartbeat->await_verdict();
              // This rank now says what happened, once: the store calls below (and the
              // threads still running) would log c10's warning with its backtrace again.
              compat::quiet_c10_log_from_now();
              const auto peer = heartbeat ? heartbeat->peer_failure() : dist::Heartbeat::PeerFailure{};
              const std::string& cause = peer.message;
              // A hang another rank declared, learnt from a collective that failed before this
              // rank's watcher read the post (a loaded machine): ended on as the watcher would.
              if (peer.hang && !cause.empty()) heartbeat->join_verdict(cause);
              if (!cause.empty() && cause.find(what) == std::string::npos) {
                what = cause + " (then on this rank: " + what.substr(0, what.find('\n')) + ")";
              } else if (cause.empty() && heartbeat && (!ours || what.find("a peer rank died") != std::string::npos)) {
                // A peer gone without a word (SIGKILL, a crash) and no launcher to say which:
                // the rank whose heartbeat stays still is the one.
                const std::string gone = heartbeat->name_silent(heartbeat->silent_peers(std::chrono::milliseconds(2500)));
                if (!gone.empty()) what = gone + " (then on this rank: " + what.substr(0, what.find('\n')) + ")";
              }
              std::cerr << "mmsp train: " << (ours || out_of_memory ? "error: " : "failed: ") << what << std::endl;
              if (heartbeat) heartbeat->report_error(what);
              return ours || out_of_memory ? 2 : 1;
            }
            if (env.rank == 0 && heartbeat && heartbeat->largest_gap_seconds() > 0)
              std::cout << std::fixed << std::setprecision(2) << "heartbeat: longest silence of a peer "
                        << heartbeat->largest_gap_seconds() << " s of the " << heartbeat->timeout_seconds()
                        << " s allowed (margin " << std::setprecision(1)
                        << heartbeat->timeout_seconds() / heartbeat->largest_gap_seconds() << "x)" << std::endl;
            return 0;
          }};
}

namespace {
std::map<int64_t, double> read_losses(const std::string& path) {
  std::ifstream in(path);
  MMSP_CHECK(in.good(), "cannot read metrics file ", path);
  std::map<int64_t, double> losses;  // a resumed run repeats steps: the last line wins
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      losses[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
    } catch (const nlohmann::json::exception& e) {
      // The last line without its newline is a write a crash cut short (the next
      // resume removes it): skipped with a note; anywhere else the file is damaged.
      if (in.eof()) {  // getline reached the end without a newline
        std::cerr << "note: " << path << ":" << n << ": skipped the torn last line (a crash mid-write)" << std::endl;
        break;
      }
      MMSP_FAIL(path, ":", n, ": not a metrics line: ", e.what());
    }
  }
  return losses;
}
}  // namespace

// Exit status: 0 when the losses agree within --max-rel (or no --max-rel was given),
// 1 when they do not (a check that ran and failed), 2 for a user error (a missing or
// malformed file, no common step, a bad --max-rel).
Subcommand add_compare_losses_command(CLI::App& parent) {
  auto files = std::make_shared<std::vector<std::string>>();
  auto max_rel = std::make_shared<double>(-1);
  CLI::App* app = parent.add_subcommand("compare-losses", "largest relative loss difference of two runs' metrics.jsonl");
  app->add_option("files", *files, "two metrics.jsonl files: A B (relative to B's losses)")->required()->expected(2);
  app->add_option("--max-rel", *max_rel, "exit 1 when the largest relative difference exceeds this");
  return {app, [files, max_rel, app]() {
            const bool check = app->count("--max-rel") > 0;
            MMSP_CHECK(!check || (std::isfinite(*max_rel) && *max_rel >= 0), "--max-rel ", *max_rel,
                       " must be a finite number >= 0");
            const auto a = read_losses(files->at(0)), b = read_losses(files->at(1));
            double worst = 0;
            int64_t worst_step = 0, common = 0;
            for (const auto& [step, loss] : a) {
              auto it = b.find(step);
              if (it == b.end()) continue;
              ++common;
              double rel = std::abs(loss - it->second) / std::max(std::abs(it->second), 1e-30);
              if (std::isnan(rel)) rel = INFINITY;  // a NaN loss on one side is the largest difference
              if (rel >= worst) worst = rel, worst_step = step;
            }
            MMSP_CHECK(common > 0, files->at(0), " and ", files->at(1), " share no step");
            std::cout << "compare-losses: " << common << " common steps, largest relative difference "
                      << worst << " (step " << worst_step << ")" << std::endl;
            if (check && worst > *max_rel) {
              std::cout << "compare-losses: FAILED: step " << worst_step << " differs by " << worst
                        << " (relative), more than --max-rel " << *max_rel << std::endl;
              return 1;
            }
            return 0;
          }};
}

}  // namespace mmsp::cli
