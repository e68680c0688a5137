// `mmsp report RUN_DIR [RUN_DIR...] [--out PREFIX]`: the runs' curves (loss, eval loss,
// learning rate, peak memory, tokens/s) drawn from their metrics.jsonl into PREFIX.png and
// PREFIX.html, the runs overlaid. The drawing is matplotlib's (python/mmsp/report.py, run
// with the build's Python as `mmsp prepare` is: python_module.h).
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_report_command(CLI::App& parent);
}  // namespace mmsp::cli
