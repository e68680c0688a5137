// `mmsp logprobs`: the log-probability (and entropy) of every labelled token of a .jsonl
// under a model, on the ranks of the job (run under mmsp-run like `mmsp train`), written
// as one JSON line per sample (docs/rl.md).
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_logprobs_command(CLI::App& parent);
}  // namespace mmsp::cli
