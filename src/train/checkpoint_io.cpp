// Durable checkpoint files; see checkpoint_io.h.
#include "checkpoint_io.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "mmsp/core/check.h"
#include "mmsp/model/safetensors.h"

namespace mmsp::train::checkpoint_io {
namespace {

std::string errno_text() { return std::strerror(errno); }

// Safetensors' data order: by dtype, widest first (as Hugging Face's writer), then name.
int dtype_rank(const std::string& dtype) {
  static const char* const order[] = {"I64", "F64", "F32", "I32", "BF16",
                                      "F16", "I16", "I8",  "U8",  "BOOL"};
  for (int i = 0; i < 10; ++i)
    if (dtype == order[i]) return i;
  MMSP_ASSERT(false, "no data order for safetensors dtype ", dtype);
  return 0;
}

struct Entry {
  const std::string* name;
  const at::Tensor* tensor;
  std::string dtype;
  uint64_t nbytes;
};

// The header exactly as model::serialize_safetensors writes it (tested byte for byte).
std::string header_text(const std::vector<Entry>& entries,
                        const std::map<std::string, std::string>& metadata) {
  std::string s = "{";
  bool first = true;
  if (!metadata.empty()) {
    s += "\"__metadata__\":" + nlohmann::json(metadata).dump();
    first = false;
  }
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    if (!first) s += ",";
    first = false;
    s += nlohmann::json(*e.name).dump() + ":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
    for (int64_t d = 0; d < e.tensor->dim(); ++d)
      s += (d ? "," : "") + std::to_string(e.tensor->size(d));
    s += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e.nbytes) +
         "]}";
    offset += e.nbytes;
  }
  s += "}";
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

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

void DurableWriter::put(int fd, const void* data, size_t n, const std::string& path) {
  size_t todo = n;
  if (crash_after_ >= 0) todo = std::min<size_t>(n, static_cast<size_t>(crash_after_ - written_));
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < todo;) {
    const ssize_t w = ::write(fd, p + done, todo - done);
    if (w < 0 && errno == EINTR) continue;
    MMSP_CHECK(w > 0, path, ": write failed after ", done, " of ", todo, " bytes: ", errno_text());
    done += static_cast<size_t>(w);
  }
  written_ += static_cast<int64_t>(todo);
  if (crash_after_ >= 0 && written_ >= crash_after_) std::_Exit(exit_code_);
}

void DurableWriter::write_text(const std::string& path, const std::string& text) {
  File f(path);
  put(f.fd(), text.data(), text.size(), path);
  f.sync_and_close();
}

void DurableWriter::write_safetensors(const std::string& path,
                                      const std::map<std::string, at::Tensor>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  std::vector<Entry> entries;
  for (const auto& [name, t] : tensors) {
    MMSP_CHECK(t.defined() && t.layout() == at::kStrided, path, ": tensor ", name,
               " is undefined or not dense");
    const std::string dtype = model::safetensors_dtype_name(t.scalar_type());
    entries.push_back({&name, &t, dtype, static_cast<uint64_t>(t.numel()) * t.element_size()});
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return dtype_rank(a.dtype) < dtype_rank(b.dtype);  // names already sorted (std::map)
  });
  const std::string header = header_text(entries, metadata);
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(uint64_t{header.size()} >> (8 * i));
  File f(path);
  put(f.fd(), prefix, 8, path);
  put(f.fd(), header.data(), header.size(), path);
  for (const Entry& e : entries) {
    if (e.nbytes == 0) continue;
    const at::Tensor cpu = e.tensor->detach().to(at::kCPU).contiguous();
    put(f.fd(), cpu.data_ptr(), e.nbytes, path);
  }
  f.sync_and_close();
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MMSP_CHECK(fd >= 0, dir, ": cannot open the directory to fsync it: ", errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  // Some filesystems refuse fsync on a directory (EINVAL); their renames are still ordered.
  MMSP_CHECK(rc == 0 || saved == EINVAL, dir, ": fsync of the directory failed: ",
             std::strerror(saved));
}

void replace_dir(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) == 0) return;  // `to` absent (or an empty dir)
  MMSP_CHECK(errno == ENOTEMPTY || errno == EEXIST, "cannot rename ", from, " to ", to, ": ",
             errno_text());
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    std::filesystem::remove_all(from);  // the old contents
    return;
  }
  MMSP_CHECK(errno == EINVAL || errno == ENOSYS, "cannot swap ", from, " with ", to, ": ",
             errno_text());
  // No atomic swap here: for a moment `to` is absent (its old contents sit at `old`).
  const std::string old = from + "-old";
  MMSP_CHECK(::rename(to.c_str(), old.c_str()) == 0, "cannot move ", to, " aside to ", old, ": ",
             errno_text());
  MMSP_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ",
             errno_text());
  std::filesystem::remove_all(old);
}

void replace_file(const std::string& from, const std::string& to) {
  MMSP_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ",
             errno_text());
}

}  // namespace mmsp::train::checkpoint_io
