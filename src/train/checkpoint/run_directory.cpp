// The --out lock and the fresh-run check; see run_directory.h.
#include "mmsp/train/checkpoint/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <utility>

#include "mmsp/core/check.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;
constexpr const char* kLockFile = ".mmsp-lock";

bool is_step_dir_name(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return false;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  return true;
}

// Is `resume` `out` itself or a checkpoint directly inside it?
bool resumes_inside(const std::string& out, const std::string& resume) {
  std::error_code ec;
  const fs::path o = fs::weakly_canonical(out, ec), r = fs::weakly_canonical(resume, ec);
  return !ec && (r == o || r.parent_path() == o);
}

std::string owner_of(int fd) {
  char buffer[256] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof buffer - 1, 0);
  std::string text = n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.empty() ? "another process" : text;
}

}  // namespace

std::vector<std::string> previous_run_files(const std::string& out) {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return found;
  const fs::path metrics = fs::path(out) / "metrics.jsonl";
  if (fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0) {
    std::ifstream in(metrics);
    int64_t lines = 0;
    for (std::string line; std::getline(in, line);) lines += !line.empty();
    found.push_back("metrics.jsonl (" + std::to_string(lines) + " lines)");
  }
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_step_dir_name(name)) steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());
  found.insert(found.end(), steps.begin(), steps.end());
  if (fs::exists(fs::path(out) / "latest", ec)) found.push_back("latest");
  return found;
}

RunDirectoryLock RunDirectoryLock::claim(const std::string& out, const std::string& resume, bool overwrite) {
  RunDirectoryLock lock;
  if (out.empty()) return lock;
  std::error_code ec;
  fs::create_directories(out, ec);
  MMSP_CHECK(!ec, "--out ", out, ": cannot create the directory: ", ec.message());
  const std::string path = (fs::path(out) / kLockFile).string();
  lock.fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  const int open_error = errno;
  MMSP_CHECK(lock.fd_ >= 0, "--out ", out, ": cannot open its lock file ", path, ": ", std::strerror(open_error));
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    MMSP_CHECK(error != EWOULDBLOCK, "--out ", out, " is in use by another job (", owner_of(lock.fd_),
               "): one job per run directory; wait for it to end, or give this job another --out");
    MMSP_CHECK(false, "--out ", out, ": cannot lock ", path, ": ", std::strerror(error));
  }
  // Who holds it, for the message of the next job that tries.
  char host[128] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string owner = "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when + "\n";
  if (::ftruncate(lock.fd_, 0) != 0 || ::pwrite(lock.fd_, owner.data(), owner.size(), 0) < 0) {
    // The lock holds without the note; only the next job's message is poorer.
  }

  const std::vector<std::string> previous = previous_run_files(out);
  if (previous.empty() || (!resume.empty() && resumes_inside(out, resume))) return lock;
  std::string listing;
  for (const auto& f : previous) listing += (listing.empty() ? "" : ", ") + f;
  if (!overwrite) {
    MMSP_CHECK(false, "--out ", out, " already holds a run (", listing, ") and this run ",
               resume.empty() ? "starts fresh" : "resumes from " + resume + ", outside it",
               ": its checkpoints would be rotated away and the metrics mixed. Pass --resume ", out,
               " to continue that run, --overwrite to replace it (its metrics and checkpoints are deleted), "
               "or another --out");
  }
  // --overwrite: the previous run's files go before this run writes any.
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    if (name == "metrics.jsonl" || name == "latest" || is_step_dir_name(name) ||
        (name[0] == '.' && name.find(".tmp-") != std::string::npos))
      fs::remove_all(entry.path());
  }
  return lock;
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
}

RunDirectoryLock::RunDirectoryLock(RunDirectoryLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

RunDirectoryLock& RunDirectoryLock::operator=(RunDirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

}  // namespace mmsp::train
