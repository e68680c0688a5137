// `mmsp prepare`; see prepare_command.h.
#include "prepare_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace mmsp::cli {

namespace {

namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// python/ of the source tree this tool was built from, else share/mmsp/python beside an
// installed tool; MMSP_PYTHONPATH overrides both.
std::string package_dir() {
  if (const char* v = std::getenv("MMSP_PYTHONPATH"); v && *v) return v;
  std::error_code ec;
  if (fs::is_directory(fs::path(MMSP_PYTHON_PACKAGE_DIR) / "mmsp", ec)) return MMSP_PYTHON_PACKAGE_DIR;
  const fs::path installed = fs::read_symlink("/proc/self/exe", ec).parent_path() / ".." / "share" / "mmsp" / "python";
  return fs::weakly_canonical(installed, ec).string();
}

int run_prepare(const std::vector<std::string>& args) {
  const std::string python = env_or("MMSP_PYTHON", MMSP_PYTHON_DEFAULT);
  if (python.empty()) {
    std::cerr << "mmsp prepare: error: no Python to run it with: this build was configured without MMSP_PYTHON; "
                 "set MMSP_PYTHON to a Python that has requirements/hf.txt installed (transformers, tokenizers)\n";
    return 2;
  }
  const std::string dir = package_dir();
  const std::string old = env_or("PYTHONPATH", "");
  ::setenv("PYTHONPATH", (old.empty() ? dir : dir + ":" + old).c_str(), 1);
  ::setenv("HF_HUB_OFFLINE", env_or("HF_HUB_OFFLINE", "1").c_str(), 1);  // a model directory, never a hub
  std::vector<std::string> argv_s = {python, "-m", "mmsp.prepare"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(python.c_str(), argv.data());
  std::cerr << "mmsp prepare: error: cannot run " << python << ": " << std::strerror(errno)
            << " (set MMSP_PYTHON to a Python that has requirements/hf.txt installed)\n";
  return 2;
}

}  // namespace

Subcommand add_prepare_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "prepare", "turn conversation data into mmsp's JSON lines with the model's own tokenizer and processors "
                 "(mmsp prepare --help; docs/prepare.md)");
  // Every argument, --help included, is the Python tool's.
  app->prefix_command();
  app->set_help_flag();
  return {app, [app]() { return run_prepare(app->remaining()); }};
}

}  // namespace mmsp::cli
