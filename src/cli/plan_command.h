// `mmsp plan`: prints the step plan of a batch (per-rank loads and balance, or JSON).
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_plan_command(CLI::App& parent);
}
