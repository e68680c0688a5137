// Sizes on the command line as transformers writes them: "5GB" (10^9), "500MB",
// "2GiB" (2^30), "1048576" (bytes); and the host's available memory for the preflight.
#pragma once

#include <cstdint>
#include <string>

namespace mmsp::cli {

// Throws mmsp::Error naming `flag` and the text unless it is a non-negative size.
int64_t parse_byte_size(const std::string& text, const std::string& flag);

// MemAvailable of /proc/meminfo in bytes (0 when it cannot be read).
int64_t host_available_memory();

}  // namespace mmsp::cli
