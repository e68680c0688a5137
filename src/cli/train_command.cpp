// `mmsp train` and `mmsp compare-losses`; see train_command.h and docs/train.md.
#include "train_command.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "byte_size.h"
#include "failure_text.h"
#include "mesh_options.h"
#include "mmsp/compat/quiet_c10_log.h"
#include "mmsp/core/check.h"
#include "mmsp/train/checkpoint/run_directory.h"
#include "mmsp/train/run_checks.h"
#include "mmsp/train/trainer.h"
#include "train_flags.h"

namespace mmsp::cli {

int report_failure(const std::string& command, const std::exception& e, const train::TrainOptions& o,
                   dist::Heartbeat* heartbeat) {
  // Said first (the launcher may stop this rank while rank 0 waits below),
  // then posted for the other ranks, which may sit in a collective.
  const FailureText failure = failure_text(e);
  const bool ours = failure.ours, out_of_memory = failure.out_of_memory;
  std::string what = failure.what;
  if (out_of_memory) {
    what = "out of memory on this rank (" + what.substr(0, what.find('\n')) + ")" +
           (o.memory.limit_bytes == 0
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
  std::cerr << "mmsp " << command << ": " << (ours || out_of_memory ? "error: " : "failed: ") << what << std::endl;
  if (heartbeat) heartbeat->report_error(what);
  return ours || out_of_memory ? 2 : 1;
}

namespace {

int run_train(const MeshFlags& flags, TrainFlags& train_flags) {
  const dist::RankEnv env = dist::rank_env_from(dist::process_environment());
  train_flags.parse();
  const dist::RankDevice rank_device = flags.rank_device(env);  // names a rank without its GPU
  train_flags.place(env, rank_device.device);
  train::TrainOptions& o = train_flags.options;
  const plan::Mesh shape = flags.shape(env.world_size);
  train::check_train_options(o, shape);
  train::probe_out_dir(o.output.out);  // every rank, before the rendezvous
  // Rank 0 writes --out and holds its lock for the run; a refusal reaches every
  // rank through the rendezvous (no rank waits for it until the timeout).
  dist::MeshOptions mesh_options = flags.options(train::agreed_flags(o), rank_device);
  train::RunDirectoryLock out_lock;
  if (env.rank == 0) {
    try {
      out_lock = train::RunDirectoryLock::claim(o.output.out, o.output.resume, o.output.overwrite);
    } catch (const Error& e) { mesh_options.refusal = e.what(); }
  }
  dist::Mesh mesh = dist::Mesh::connect(env, shape, mesh_options);
  if (env.rank == 0 && mesh.hosts().spans_hosts()) std::cout << "mmsp train: " << mesh.hosts().summary() << std::endl;
  auto activity = std::make_shared<dist::RankActivity>();
  const auto heartbeat = flags.start_heartbeat(env, mesh, activity);
  o.output.report_parameters = false;  // the checkpoint holds them; a copy per rank would not fit
  o.output.report_steps = false;       // metrics.jsonl holds them; the summary is folded as it goes
  try {
    train::check_out_shared(o.output.out, mesh);  // one --out for every host, or no rank starts
    train::train(o, mesh, std::cout, activity.get());
  } catch (const std::exception& e) { return report_failure("train", e, o, heartbeat.get()); }
  if (env.rank == 0 && heartbeat && heartbeat->largest_gap_seconds() > 0)
    std::cout << std::fixed << std::setprecision(2) << "heartbeat: longest silence of a peer "
              << heartbeat->largest_gap_seconds() << " s of the " << heartbeat->timeout_seconds()
              << " s allowed (margin " << std::setprecision(1)
              << heartbeat->timeout_seconds() / heartbeat->largest_gap_seconds() << "x)" << std::endl;
  return 0;
}

}  // namespace

Subcommand add_train_command(CLI::App& parent) {
  auto mesh = std::make_shared<MeshFlags>();
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* app = parent.add_subcommand("train", "train a VLM with its sequences split across the ranks");
  mesh->add_to(*app);
  flags->add_to(*app);
  return {app, [mesh, flags]() { return run_train(*mesh, *flags); }};
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
  CLI::App* app =
      parent.add_subcommand("compare-losses", "largest relative loss difference of two runs' metrics.jsonl");
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
            std::cout << "compare-losses: " << common << " common steps, largest relative difference " << worst
                      << " (step " << worst_step << ")" << std::endl;
            if (check && worst > *max_rel) {
              std::cout << "compare-losses: FAILED: step " << worst_step << " differs by " << worst
                        << " (relative), more than --max-rel " << *max_rel << std::endl;
              return 1;
            }
            return 0;
          }};
}

}  // namespace mmsp::cli
