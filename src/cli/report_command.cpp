// `mmsp report`; see report_command.h.
#include "report_command.h"

#include "python_module.h"

namespace mmsp::cli {

Subcommand add_report_command(CLI::App& parent) {
  CLI::App* app =
      parent.add_subcommand("report",
                            "draw runs' curves (loss, eval loss, lr, memory, tokens/s) into a PNG and an HTML page "
                            "(mmsp report --help; docs/metrics.md)");
  app->prefix_command();  // every argument, --help included, is the Python tool's
  app->set_help_flag();
  return {app, [app]() {
            return exec_python_module("report", "report", app->remaining(),
                                      "requirements/hf.txt installed (matplotlib)");
          }};
}

}  // namespace mmsp::cli
