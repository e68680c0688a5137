// `mmsp bench ...`: benchmarks that print JSON (see docs/benchmarks.md).
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_bench_command(CLI::App& parent);
}
