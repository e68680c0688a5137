// Durable checkpoint files; see checkpoint_io.h.
#include "checkpoint/checkpoint_io.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "mmsp/core/check.h"
#include "mmsp/hf/safetensors.h"

namespace mmsp::train::checkpoint_io {
namespace {

std::string errno_text() { return std::strerror(errno); }

class File {
 public:
  explicit File(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    MMSP_CHECK(fd_ >= 0, path, ": cannot create: ", errno_text());
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  void sync_and_close() {
    MMSP_CHECK(::fsync(fd_) == 0, path_, ": fsync failed: ", errno_text());
    const int fd = fd_;
    fd_ = -1;
    MMSP_CHECK(::close(fd) == 0, path_, ": close failed: ", errno_text());
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

DurableWriter::DurableWriter(int64_t crash_after_bytes, int exit_code)
    : crash_after_(crash_after_bytes), exit_code_(exit_code) {}

void DurableWriter::count(int64_t n) {
  written_ += n;
  if (crash_after_ >= 0 && written_ >= crash_after_) std::_Exit(exit_code_);
}

void DurableWriter::put(int fd, const void* data, size_t n, const std::string& path, hf::ChecksumSink& hash) {
  size_t todo = n;
  if (crash_after_ >= 0) todo = std::min<size_t>(n, static_cast<size_t>(crash_after_ - written_));
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < todo;) {
    const ssize_t w = ::write(fd, p + done, todo - done);
    if (w < 0 && errno == EINTR) continue;
    MMSP_CHECK(w > 0, path, ": write failed after ", done, " of ", todo, " bytes: ", errno_text());
    done += static_cast<size_t>(w);
  }
  hash.update(data, todo);
  written_ += static_cast<int64_t>(todo);
  if (crash_after_ >= 0 && written_ >= crash_after_) std::_Exit(exit_code_);
}

void DurableWriter::write_text(const std::string& path, const std::string& text) {
  File f(path);
  hf::ChecksumSink hash;
  put(f.fd(), text.data(), text.size(), path, hash);
  f.sync_and_close();
  checksums_[path] = hash.result();
}

void DurableWriter::write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  File f(path);
  hf::ChecksumSink hash;
  hf::write_safetensors(tensors, metadata, [&](const void* data, uint64_t size) {
    put(f.fd(), data, static_cast<size_t>(size), path, hash);
  });
  f.sync_and_close();
  checksums_[path] = hash.result();
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MMSP_CHECK(fd >= 0, dir, ": cannot open the directory to fsync it: ", errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  // Some filesystems refuse fsync on a directory (EINVAL); their renames are still ordered.
  MMSP_CHECK(rc == 0 || saved == EINVAL, dir, ": fsync of the directory failed: ", std::strerror(saved));
}

void replace_dir(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) == 0) return;  // `to` absent (or an empty dir)
  MMSP_CHECK(errno == ENOTEMPTY || errno == EEXIST, "cannot rename ", from, " to ", to, ": ", errno_text());
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    std::filesystem::remove_all(from);  // the old contents
    return;
  }
  MMSP_CHECK(errno == EINVAL || errno == ENOSYS, "cannot swap ", from, " with ", to, ": ", errno_text());
  // No atomic swap here: for a moment `to` is absent (its old contents sit at `old`).
  const std::string old = from + "-old";
  MMSP_CHECK(::rename(to.c_str(), old.c_str()) == 0, "cannot move ", to, " aside to ", old, ": ", errno_text());
  MMSP_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ", errno_text());
  std::filesystem::remove_all(old);
}

void replace_file(const std::string& from, const std::string& to) {
  MMSP_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ", errno_text());
}

}  // namespace mmsp::train::checkpoint_io
