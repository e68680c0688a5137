// `mmsp bench ...`: benchmarks that print JSON (see docs/bench/README.md).
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_bench_command(CLI::App& parent);
}
