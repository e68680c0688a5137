// `mmsp selftest`: checks every collective on every group of the mesh.
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_selftest_command(CLI::App& parent);
}
