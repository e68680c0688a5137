// `mmsp train`: trains a VLM on the ranks of the job (run under mmsp-run, torchrun,
// mpirun or srun); `mmsp compare-losses`: the largest relative difference between the
// loss sequences of two runs' metrics files (make demo: 4 ranks against 1).
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_train_command(CLI::App& parent);
Subcommand add_compare_losses_command(CLI::App& parent);
}  // namespace mmsp::cli
