// safetensors files: CPU tensors in and out, in the format Hugging Face reads and writes.
// Layout: 8-byte little-endian header length N, N bytes of JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data.
// The reader checks every header field against the file before it reads a byte of data;
// what to load into which module is the model's business, not this file's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace mmsp::hf {

// Largest header the reader accepts (the Hugging Face reader's limit, 100 MB).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// Most dimensions a tensor may have; a file claiming more is treated as malformed.
constexpr size_t kSafetensorsMaxDims = 64;

// One tensor as the header describes it.
struct SafetensorsEntry {
  std::string dtype;           // safetensors dtype name: "F32", "BF16", "BOOL", ...
  at::ScalarType scalar_type;  // the same as a LibTorch dtype
  std::vector<int64_t> shape;  // [] is a 0-d tensor (one element)
  uint64_t data_begin = 0;     // byte offsets within the data section (after the header)
  uint64_t data_end = 0;
};

// A checked header: everything in it agrees with the file it came from.
struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" object
  uint64_t header_bytes = 0;                    // N, including the padding
  uint64_t data_bytes = 0;                      // size of the data section: file size - 8 - N
};

// Header only: reads 8 + N bytes, checks them against the file size, reads no tensor data.
SafetensorsHeader read_safetensors_header(const std::string& path);

// Every tensor of the file (CPU, contiguous, the file's dtype), keyed by name.
// Throws mmsp::Error naming the file, the tensor and the bad value for any malformed file.
std::map<std::string, at::Tensor> load_safetensors(const std::string& path);

// Writes `tensors` (any device; copied to CPU, made contiguous) and `metadata`.
// Deterministic: the same input gives the same bytes, laid out as Hugging Face's writer
// does (data ordered by dtype, widest first, then by name, so each tensor is aligned
// to its element size; header padded with spaces to a multiple of 8).
// Atomic: writes `path + ".tmp"`, fsyncs, renames over `path`; a crash leaves either
// the old file or the new one under `path`, never half a file.
void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The same, in memory: `source` names the buffer in error messages.
SafetensorsHeader parse_safetensors_header(const void* data, size_t size, const std::string& source = "<memory>");
std::map<std::string, at::Tensor> parse_safetensors(const void* data, size_t size,
                                                    const std::string& source = "<memory>");
std::string serialize_safetensors(const std::map<std::string, at::Tensor>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// The same bytes, streamed to `sink` piece by piece (header, then each tensor's data),
// for writers that manage the file themselves (e.g. checkpoints). Everything is
// validated before the first call to `sink`.
void write_safetensors(const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void* data, uint64_t size)>& sink);

// Byte I/O on an open file descriptor, retrying short reads and writes and EINTR;
// `path` names the file in errors. Shared with the Hugging Face directory reader and
// writer (hf_directory.h), which pread tensors straight into parameters.
void pread_exact(int fd, void* buffer, uint64_t size, uint64_t offset, const std::string& path);
void write_exact(int fd, const void* buffer, uint64_t size, const std::string& path);

// "F32" <-> at::kFloat for the dtypes mmsp reads and writes:
// F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
std::string safetensors_dtype_name(at::ScalarType type);
at::ScalarType safetensors_scalar_type(const std::string& dtype);

}  // namespace mmsp::hf
