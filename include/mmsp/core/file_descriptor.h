// An owned POSIX file descriptor: closed when it goes out of scope, movable, never copied.
#pragma once

#include <unistd.h>

#include <utility>

namespace mmsp {

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd = -1) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor& operator=(FileDescriptor&&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Hands the descriptor over (e.g. to close it explicitly and check the result).
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace mmsp
