// Python modules run as mmsp commands; see python_module.h.
#include "python_module.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

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

}  // namespace

int exec_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args,
                       const std::string& needs) {
  const std::string python = env_or("MMSP_PYTHON", MMSP_PYTHON_DEFAULT);
  if (python.empty()) {
    std::cerr << "mmsp " << command << ": error: no Python to run it with: this build was configured without "
              << "MMSP_PYTHON; set MMSP_PYTHON to a Python that has " << needs << "\n";
    return 2;
  }
  const std::string dir = package_dir();
  const std::string old = env_or("PYTHONPATH", "");
  ::setenv("PYTHONPATH", (old.empty() ? dir : dir + ":" + old).c_str(), 1);
  ::setenv("HF_HUB_OFFLINE", env_or("HF_HUB_OFFLINE", "1").c_str(), 1);  // a model directory, never a hub
  std::vector<std::string> argv_s = {python, "-m", "mmsp." + module};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(python.c_str(), argv.data());
  std::cerr << "mmsp " << command << ": error: cannot run " << python << ": " << std::strerror(errno)
            << " (set MMSP_PYTHON to a Python that has " << needs << ")\n";
  return 2;
}

}  // namespace mmsp::cli
