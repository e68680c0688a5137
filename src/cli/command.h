// A subcommand of `mmsp`: each command file registers its options on the parent
// CLI11 app and returns the function that runs it (its exit status).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace mmsp::cli {

struct Subcommand {
  CLI::App* app = nullptr;   // the parsed subcommand (options bound by the command)
  std::function<int()> run;  // runs the command after parsing; returns the exit status
};

}  // namespace mmsp::cli
