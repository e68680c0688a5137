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
#include "mmsp/dist/store_agreement.h"

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

bool resumes_from_nothing(const std::string& out, const std::string& resume) {
  if (out.empty() || resume.empty()) return false;
  std::error_code ec;
  const fs::path o = fs::weakly_canonical(out, ec);
  if (ec || fs::weakly_canonical(resume, ec) != o || ec) return false;
  for (const std::string& f : previous_run_files(out))
    if (f.rfind("metrics.jsonl", 0) != 0) return false;  // a step dir or `latest`: a checkpoint to resume
  return true;
}

void check_out_shared(const std::string& out, const dist::Mesh& mesh) {
  if (out.empty() || !mesh.store() || !mesh.hosts().spans_hosts()) return;
  // What this rank finds at OUT/.mmsp-lock: rank 0's note ("pid … on host, since …").
  std::string seen = "nothing there";
  const std::string path = (fs::path(out) / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    seen = owner_of(fd);
    ::close(fd);
  }
  const std::vector<dist::AgreedFlags> all =
      dist::exchange_through_store(*mesh.store(), "out-directory", mesh.rank(), mesh.world_size(),
                                   mesh.world()->timeout(), {{"the lock note in --out", seen}});
  std::vector<int> elsewhere;
  std::string their;
  for (int r = 1; r < mesh.world_size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) {
      elsewhere.push_back(r);
      if (their.empty() && !all[static_cast<size_t>(r)].empty()) their = all[static_cast<size_t>(r)][0].second;
    }
  MMSP_CHECK(elsewhere.empty(), "--out ", out,
             " is not one directory shared by the job's hosts: ", mesh.hosts().name_ranks(elsewhere),
             " do not see there the lock file rank 0 wrote on ", mesh.hosts().name_host_of(0), " (they find: ", their,
             "). Checkpoints are written there by rank 0 (with --shard, every rank writes its part) and read by "
             "every rank on --resume: give --out a directory every host mounts at that path (NFS, Lustre, a "
             "cloud file system), or run without --out; stopped before the first collective");
}

RunDirectoryLock RunDirectoryLock::claim(const std::string& out, const std::string& resume, bool overwrite) {
  RunDirectoryLock lock;
  if (out.empty()) return lock;
  std::error_code ec;
  fs::create_directories(out, ec);
  MMSP_CHECK(!ec, "--out ", out, ": cannot create the directory: ", ec.message());
  const std::string path = (fs::path(out) / kLockFile).string();
  // O_NOFOLLOW: a symlink planted as the lock file is refused, never followed to the file
  // it names (which the owner note below would overwrite).
  lock.fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0644);
  const int open_error = errno;
  MMSP_CHECK(lock.fd_ >= 0, "--out ", out, ": cannot open its lock file ", path, ": ", std::strerror(open_error),
             open_error == ELOOP ? " (it is a symbolic link; mmsp locks only a file of its own: remove the link)" : "");
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    MMSP_CHECK(error != EWOULDBLOCK, "--out ", out, " is in use by another job (", owner_of(lock.fd_),
               "): one job per run directory; wait for it to end, or give this job another --out");
    MMSP_FAIL("--out ", out, ": cannot lock ", path, ": ", std::strerror(error));
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

  // The metrics file is appended to by rank 0 (opened with O_NOFOLLOW there too): a link
  // in its place is refused now, before any step, rather than at the first line
  // (--overwrite deletes it as a link, below).
  const fs::path metrics = fs::path(out) / "metrics.jsonl";
  if (fs::is_symlink(metrics, ec)) {
    MMSP_CHECK(overwrite, "--out ", out, ": metrics.jsonl is a symbolic link; mmsp writes its metrics only to a file ",
               "of its own (remove the link, or pass --overwrite, which removes it and never its target)");
    fs::remove(metrics, ec);  // the link itself
  }
  const std::vector<std::string> previous = previous_run_files(out);
  if (previous.empty() || (!resume.empty() && resumes_inside(out, resume))) return lock;
  std::string listing;
  for (const auto& f : previous) listing += (listing.empty() ? "" : ", ") + f;
  if (!overwrite) {
    MMSP_FAIL("--out ", out, " already holds a run (", listing, ") and this run ",
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
