// checksums.json: the XXH64 and size of every file a save writes into a directory
// (a checkpoint's step dir, an hf/ model directory), with a format version; written
// last, verified before anything is loaded. A mismatch names the file; a manifest of
// a newer format is refused naming both versions; a directory without one (an older
// checkpoint, a released model) is read unverified — the caller says so.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "mmsp/core/xxhash64.h"

namespace mmsp::hf {

constexpr const char* kChecksumFile = "checksums.json";
constexpr int kChecksumFormatVersion = 1;

struct FileChecksum {
  uint64_t size = 0;
  uint64_t xxh64 = 0;
};
// by path relative to the manifest's directory ("hf/config.json")
using ChecksumManifest = std::map<std::string, FileChecksum>;

// Hashes bytes as they are written.
class ChecksumSink {
 public:
  void update(const void* data, uint64_t n) {
    hash_.update(data, static_cast<size_t>(n));
    size_ += n;
  }
  FileChecksum result() const { return {size_, hash_.digest()}; }

 private:
  XxHash64 hash_;
  uint64_t size_ = 0;
};

// The file's checksum, read in 1 MiB pieces.
FileChecksum checksum_of_file(const std::string& path);

// {"algorithm": "xxh64", "files": {"a": {"size": n, "xxh64": "hex"}}, "format_version": 1,
//  "manifest_xxh64": XXH64 of the rest as nlohmann dumps it compactly}
std::string checksum_manifest_json(const ChecksumManifest& files);

enum class ManifestCheck { verified, absent };
struct ManifestVerdict {
  ManifestCheck check = ManifestCheck::absent;
  std::set<std::string> files;  // what it lists, relative to its directory: every one verified
  std::string manifest_xxh64;   // its own checksum: one value for every byte it covers
};
// Verifies every file `dir`/checksums.json lists (it may list files in subdirs).
// Throws mmsp::Error naming the file on a missing file, a size or checksum mismatch,
// an unreadable manifest, or a format version newer than kChecksumFormatVersion.
ManifestVerdict verify_checksum_manifest(const std::string& dir);

// A directory with a manifest loads only files it lists: throws mmsp::Error naming
// `file` (relative to `dir`) when a verified manifest does not list it (a file added or
// replaced after the save would otherwise be loaded unverified). No-op without one.
void check_listed(const ManifestVerdict& verdict, const std::string& dir, const std::string& file);

}  // namespace mmsp::hf
