// Durable files for checkpoints (private to the train layer): a writer that creates
// each file, writes it, fsyncs it and counts the bytes (for the crash test hook),
// safetensors streamed tensor by tensor, and the directory operations that make a
// save atomic. Which files make a checkpoint is checkpoint.cpp's business.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "mmsp/hf/checksum_manifest.h"

namespace mmsp::train::checkpoint_io {

class DurableWriter {
 public:
  // crash_after_bytes ≥ 0: std::_Exit(exit_code) once that many bytes have been
  // written in total by this writer, possibly mid-file (a test hook); −1: off.
  DurableWriter(int64_t crash_after_bytes, int exit_code);

  // Creates `path` (which must not exist), writes `text`, fsyncs, closes.
  void write_text(const std::string& path, const std::string& text);
  // The same for a safetensors file, byte for byte what hf::serialize_safetensors
  // gives, but streamed: one tensor's CPU copy at a time, never the whole file.
  void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                         const std::map<std::string, std::string>& metadata);

  // Counts `n` bytes written by someone else (e.g. hf::save_hf_directory through
  // its progress hook) towards crash_after_bytes; exits once that is reached.
  void count(int64_t n);

  int64_t bytes_written() const { return written_; }
  // XXH64 and size of every file written through write_text / write_safetensors,
  // taken from the bytes as they went out, by path.
  const hf::ChecksumManifest& checksums() const { return checksums_; }

 private:
  void put(int fd, const void* data, size_t n, const std::string& path, hf::ChecksumSink& hash);
  hf::ChecksumManifest checksums_;

  int64_t crash_after_;
  int exit_code_;
  int64_t written_ = 0;
};

// fsync of a directory, so the names created or renamed in it are durable.
void sync_dir(const std::string& dir);

// Moves directory `from` to `to` atomically. When `to` exists it is swapped with
// `from` (renameat2 RENAME_EXCHANGE) and the old contents, now at `from`, removed;
// where the filesystem cannot swap, `to` is first renamed to `from` + "-old".
void replace_dir(const std::string& from, const std::string& to);

// Renames file `from` over `to` (atomic replace).
void replace_file(const std::string& from, const std::string& to);

}  // namespace mmsp::train::checkpoint_io
