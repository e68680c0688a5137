// checksums.json writing and verification; see checksum_manifest.h.
#include "mmsp/hf/checksum_manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/core/json_read.h"

namespace mmsp::hf {

FileChecksum checksum_of_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MMSP_CHECK(fd >= 0, path, ": cannot open to verify its checksum: ", std::strerror(errno));
  ChecksumSink sink;
  std::vector<char> buffer(1 << 20);
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      MMSP_CHECK(n == 0, path, ": read failed while verifying its checksum: ", std::strerror(err));
      break;
    }
    sink.update(buffer.data(), static_cast<uint64_t>(n));
  }
  return sink.result();
}

std::string checksum_manifest_json(const ChecksumManifest& files) {
  nlohmann::json j;
  j["format_version"] = kChecksumFormatVersion;
  j["algorithm"] = "xxh64";
  nlohmann::json list = nlohmann::json::object();
  for (const auto& [name, c] : files) list[name] = {{"size", c.size}, {"xxh64", XxHash64::hex(c.xxh64)}};
  j["files"] = list;
  // The manifest's own checksum, over the rest of it as dumped: a damaged manifest is
  // named as such rather than blamed on a file it lists.
  j["manifest_xxh64"] = XxHash64::hex(XxHash64::of(j.dump()));
  return j.dump(2) + "\n";
}

ManifestVerdict verify_checksum_manifest(const std::string& dir) {
  ManifestVerdict verdict;
  const std::string path = dir + "/" + kChecksumFile;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return verdict;
  const nlohmann::json j = read_json_file(path);
  MMSP_CHECK(j.is_object(), path, ": must be a JSON object (corrupted?)");
  const int64_t version = json_int(j, "format_version", path, 1, 1'000'000);
  MMSP_CHECK(version <= kChecksumFormatVersion, path, ": format version ", version,
             " is newer than this mmsp reads (version ", kChecksumFormatVersion,
             "); use the mmsp that wrote it, or a newer one");
  MMSP_CHECK(j.contains("manifest_xxh64") && j["manifest_xxh64"].is_string(), path,
             ": has no manifest_xxh64 (damaged?)");
  {
    nlohmann::json rest = j;
    rest.erase("manifest_xxh64");
    MMSP_CHECK(XxHash64::hex(XxHash64::of(rest.dump())) == j["manifest_xxh64"].get<std::string>(), path,
               ": damaged: its own checksum (manifest_xxh64) does not match its content; use another checkpoint");
    verdict.manifest_xxh64 = j["manifest_xxh64"].get<std::string>();
  }
  MMSP_CHECK(j.contains("algorithm") && j["algorithm"] == "xxh64", path, ": algorithm ",
             j.contains("algorithm") ? j["algorithm"].dump() : "(missing)", " is not \"xxh64\"");
  MMSP_CHECK(j.contains("files") && j["files"].is_object(), path, ": has no \"files\" object (corrupted?)");
  for (const auto& [name, entry] : j["files"].items()) {
    MMSP_CHECK(!name.empty() && name[0] != '/' && name.find("..") == std::string::npos, path, ": file name '", name,
               "' must be relative, inside ", dir);
    MMSP_CHECK(entry.is_object(), path, ": entry of ", name, " must be an object");
    const uint64_t size = static_cast<uint64_t>(json_int(entry, "size", path + ": " + name, 0, INT64_MAX));
    const std::string hex = entry.value("xxh64", std::string());
    MMSP_CHECK(hex.size() == 16 && hex.find_first_not_of("0123456789abcdef") == std::string::npos, path, ": xxh64 of ",
               name, " must be 16 hex digits, got '", hex, "'");
    const std::string file = dir + "/" + name;
    struct stat fst {};
    MMSP_CHECK(::stat(file.c_str(), &fst) == 0 && S_ISREG(fst.st_mode), file, ": missing, but listed in ", path,
               " (an incomplete or altered checkpoint)");
    MMSP_CHECK(static_cast<uint64_t>(fst.st_size) == size, file, ": ", fst.st_size, " bytes, but ", path, " records ",
               size, ": the file is damaged (truncated or altered); use another checkpoint");
    const FileChecksum actual = checksum_of_file(file);
    MMSP_CHECK(XxHash64::hex(actual.xxh64) == hex, file, ": checksum mismatch (xxh64 ", XxHash64::hex(actual.xxh64),
               ", but ", path, " records ", hex,
               "): the file is corrupted; use another checkpoint (an earlier step-*) or the original files");
    verdict.files.insert(name);
  }
  verdict.check = ManifestCheck::verified;
  return verdict;
}

void check_listed(const ManifestVerdict& verdict, const std::string& dir, const std::string& file) {
  if (verdict.check != ManifestCheck::verified) return;
  MMSP_CHECK(verdict.files.count(file) > 0, dir, "/", file, " is not listed in ", dir, "/", kChecksumFile,
             ", which lists every file of the save: it was added or renamed afterwards and would be loaded "
             "unverified; remove it, or restore the directory as it was saved");
}

}  // namespace mmsp::hf
