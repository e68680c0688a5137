// `mmsp plan`: prints the step plan of a batch (per-rank loads and balance, or JSON).
#pragma once

#include "command.h"

namespace mmsp::cli {
// Plans with what planning uses and checks that alone: the family's conventions
// (token ids, merge size, mRoPE sections) and, where the config declares one, the
// vocabulary. A config holding only those plans; the rest of the model is `mmsp train`'s.
Subcommand add_plan_command(CLI::App& parent);
}  // namespace mmsp::cli
