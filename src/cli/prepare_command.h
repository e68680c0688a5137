// `mmsp prepare ...`: conversation data (LLaVA `conversations`, OpenAI/ShareGPT
// `messages`, plain text) → mmsp's JSON lines, with the model directory's own tokenizer,
// chat template and processors. The work is transformers' (Python: python/mmsp/prepare,
// docs/prepare.md); this command runs it with the Python the build was configured with
// (MMSP_PYTHON; the environment variable of that name overrides it), passing every
// argument through.
#pragma once

#include "command.h"

namespace mmsp::cli {
Subcommand add_prepare_command(CLI::App& parent);
}  // namespace mmsp::cli
