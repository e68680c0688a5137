// `mmsp train`: trains a VLM on the ranks of the job (run under mmsp-run, torchrun,
// mpirun or srun); `mmsp compare-losses`: the largest relative difference between the
// loss sequences of two runs' metrics files (make demo: 4 ranks against 1).
#pragma once

#include <exception>
#include <string>

#include "command.h"
#include "mmsp/dist/heartbeat.h"
#include "mmsp/train/train_options.h"

namespace mmsp::cli {
// What this rank of `mmsp COMMAND` says when its run ends on an exception, and its exit
// status: the peer's reason first when a peer ended it (its message, or the rank whose
// heartbeat stopped), out-of-memory with the preflight's part in it, c10's backtrace cut.
int report_failure(const std::string& command, const std::exception& e, const train::TrainOptions& o,
                   dist::Heartbeat* heartbeat);
Subcommand add_train_command(CLI::App& parent);
Subcommand add_compare_losses_command(CLI::App& parent);
}  // namespace mmsp::cli
