// `mmsp families [--json]`: the model types mmsp trains, each with its family and its vision
// tokens as text, from the model layer's registry. --json writes the table the Python side
// reads (python/mmsp/families.json: `mmsp prepare`, the tests), so that a family is added
// in C++ and its Python entry generated, not written.
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_families_command(CLI::App& parent);
}
