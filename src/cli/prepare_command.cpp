// `mmsp prepare`; see prepare_command.h.
#include "prepare_command.h"

#include "python_module.h"

namespace mmsp::cli {

Subcommand add_prepare_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "prepare",
      "turn conversation data into mmsp's JSON lines with the model's own tokenizer and processors "
      "(mmsp prepare --help; docs/prepare.md)");
  // Every argument, --help included, is the Python tool's.
  app->prefix_command();
  app->set_help_flag();
  return {app, [app]() {
            return exec_python_module("prepare", "prepare", app->remaining(),
                                      "requirements/hf.txt installed (transformers, tokenizers)");
          }};
}

}  // namespace mmsp::cli
