// Byte sizes and the host's memory; see byte_size.h.
#include "byte_size.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "mmsp/core/check.h"

namespace mmsp::cli {

int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  size_t end = 0;
  double value = -1;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) { end = 0; }
  std::string unit = text.substr(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "KB")
    scale = 1e3;
  else if (unit == "MB")
    scale = 1e6;
  else if (unit == "GB")
    scale = 1e9;
  else if (unit == "TB")
    scale = 1e12;
  else if (unit == "KIB")
    scale = 1024.0;
  else if (unit == "MIB")
    scale = 1024.0 * 1024;
  else if (unit == "GIB")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "TIB")
    scale = 1024.0 * 1024 * 1024 * 1024;
  const double bytes = value * scale;
  MMSP_CHECK(end > 0 && scale > 0 && std::isfinite(bytes) && bytes >= 0 && bytes < 9.2e18, flag, " '", text,
             "' is not a size: a non-negative number with an optional unit B, KB, MB, GB, TB (powers of "
             "1000, as transformers' max_shard_size) or KiB, MiB, GiB, TiB");
  return static_cast<int64_t>(bytes);
}

int64_t host_available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  return 0;
}

}  // namespace mmsp::cli
