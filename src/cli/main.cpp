// `mmsp`: the command-line tool. Each subcommand lives in its own *_command.cpp;
// this file only parses and dispatches, and turns errors into exit statuses.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "bench_command.h"
#include "block_cache.h"
#include "command.h"
#include "failure_text.h"
#include "families_command.h"
#include "heap_policy.h"
#include "logprobs_command.h"
#include "mmsp/compat/quiet_c10_log.h"
#include "mmsp/core/check.h"
#include "pixels_command.h"
#include "plan_command.h"
#include "prepare_command.h"
#include "report_command.h"
#include "selftest_command.h"
#include "thread_policy.h"
#include "train_command.h"

int main(int argc, char** argv) {
  mmsp::cli::map_large_blocks_separately();  // before any tensor: see heap_policy.h
  try {
    mmsp::cli::install_block_cache();  // and block_cache.h
  } catch (const std::exception& e) {
    std::cerr << "mmsp: " << e.what() << "\n";
    return 2;
  }
  mmsp::cli::set_rank_threads();  // before any kernel: see thread_policy.h
  // The user's TORCH_CPP_LOG_LEVEL wins over mmsp's quieting of c10 (compat/quiet_c10_log.h).
  mmsp::compat::c10_log_level_chosen_by_user() = std::getenv("TORCH_CPP_LOG_LEVEL") != nullptr;
  CLI::App app{"mmsp: sequence-parallel training of vision-language models"};
  app.require_subcommand(1);
  std::vector<mmsp::cli::Subcommand> commands;
  commands.push_back(mmsp::cli::add_train_command(app));
  commands.push_back(mmsp::cli::add_logprobs_command(app));
  commands.push_back(mmsp::cli::add_compare_losses_command(app));
  commands.push_back(mmsp::cli::add_selftest_command(app));
  commands.push_back(mmsp::cli::add_bench_command(app));
  commands.push_back(mmsp::cli::add_plan_command(app));
  commands.push_back(mmsp::cli::add_pixels_command(app));
  commands.push_back(mmsp::cli::add_prepare_command(app));
  commands.push_back(mmsp::cli::add_families_command(app));
  commands.push_back(mmsp::cli::add_report_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help prints and exits 0; every rejected flag is a user error: status 2, like
    // the checks that run after parsing, never CLI11's own codes (104, 105, ...).
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  for (auto& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      return command.run();
    } catch (const mmsp::Error& e) {
      std::cerr << "mmsp " << command.app->get_name() << ": error: " << e.what() << std::endl;
      return 2;
    } catch (const std::exception& e) {
      // Another layer's exception: c10's backtrace cut; an allocation that failed is a
      // limit of this host or process the user can act on (status 2), named as one.
      const mmsp::cli::FailureText failure = mmsp::cli::failure_text(e);
      if (failure.out_of_memory) {
        const std::string what = failure.bytes_asked >= 0
                                     ? "an allocation of " + std::to_string(failure.bytes_asked) + " bytes (" +
                                           std::to_string(failure.bytes_asked >> 20) + " MiB) failed"
                                     : failure.what.substr(0, failure.what.find('\n'));
        std::cerr << "mmsp " << command.app->get_name() << ": error: out of memory (" << what
                  << "): what this command holds at once did not fit in the memory this process may use "
                     "(the host's, or a limit such as ulimit -v); give it less at once (mmsp pixels: --first "
                     "and --count) or run it where more memory is free"
                  << std::endl;
        return 2;
      }
      std::cerr << "mmsp " << command.app->get_name() << ": failed: " << failure.what << std::endl;
      return 1;
    }
  }
  return 1;
}
