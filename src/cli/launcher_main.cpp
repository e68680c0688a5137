// mmsp-run: starts N local ranks of a program with torchrun's environment variables
// and stops them all when one fails (docs/launcher.md). This file only parses the
// flags and maps errors to exit statuses; launcher.cpp does the work.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "launcher.h"
#include "mmsp/core/check.h"

namespace {

constexpr int kUsageError = 2;  // bad flags or an unusable PROGRAM; nothing was started
constexpr const char* kUsage = "usage: mmsp-run -n N [options] -- PROGRAM ARGS...  (see --help)";

void add_flags(CLI::App& app, mmsp::cli::LaunchOptions& o, bool& no_prefix) {
  app.add_option("-n,--nproc-per-node", o.nproc, "ranks to start on this node")->required();
  app.add_option("--nnodes", o.nnodes, "nodes in the job (WORLD_SIZE = nnodes * n)")->capture_default_str();
  app.add_option("--node-rank", o.node_rank, "this node's index (RANK = node_rank * n + local)")->capture_default_str();
  app.add_option("--master-addr", o.master_addr, "address of rank 0's TCPStore")->capture_default_str();
  app.add_option("--master-port", o.master_port,
                 "port of rank 0's TCPStore (default: a free port; required with --nnodes > 1)");
  app.add_flag("--no-prefix", no_prefix, "let ranks write straight to our stdout/stderr, without \"[rank K] \"");
  app.add_option("--grace", o.grace_s, "seconds the other ranks get to exit after the first failure before SIGTERM")
      ->capture_default_str();
  app.add_option("--kill-after", o.kill_after_s, "seconds from SIGTERM to SIGKILL")->capture_default_str();
  // PROGRAM ARGS... start at the first positional (or after "--"): flags in ARGS
  // belong to PROGRAM, not to us.
  app.prefix_command();
  app.footer("Everything after \"--\" (or the first positional) is PROGRAM ARGS...");
}

// CLI11 keeps the "--" separator in remaining(); it is not part of the command.
// Without "--", an unknown flag also ends up first there: report it as a flag.
std::vector<std::string> program_and_args(const CLI::App& app) {
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
    throw mmsp::Error("unknown option '" + rest.front() + "' (put PROGRAM ARGS... after --)");
  }
  return rest;
}

}  // namespace

int main(int argc, char** argv) {
  mmsp::cli::LaunchOptions options;
  bool no_prefix = false;
  CLI::App app{
      "mmsp-run -n N [options] -- PROGRAM ARGS...\n"
      "Starts N local ranks with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
      "MASTER_ADDR, MASTER_PORT set; stops them all when one fails.",
      "mmsp-run"};
  add_flags(app, options, no_prefix);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int status = app.exit(e);  // prints help (status 0) or the error
    return status == 0 ? 0 : kUsageError;
  }
  options.prefix = !no_prefix;

  std::string program;
  try {
    options.command = program_and_args(app);
    program = mmsp::cli::validate(options);
    if (options.master_port == 0) options.master_port = mmsp::cli::find_free_port(options.master_addr);
    // One node: a fresh run id, unless the user set one. Several nodes must agree on
    // it, so there the ranks derive it from MASTER_ADDR:MASTER_PORT and WORLD_SIZE.
    const char* user_id = std::getenv("MMSP_RUN_ID");
    if ((user_id == nullptr || *user_id == '\0') && options.nnodes == 1) options.run_id = mmsp::cli::make_run_id();
  } catch (const mmsp::Error& e) {
    std::cerr << "mmsp-run: " << e.what() << "\n" << kUsage << "\n";
    return kUsageError;
  }
  try {
    return mmsp::cli::launch(options, program);
  } catch (const mmsp::Error& e) {
    std::cerr << "mmsp-run: " << e.what() << "\n";
    return 1;
  }
}
