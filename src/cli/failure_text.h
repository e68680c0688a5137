// How an exception that ends a command reads: c10's backtrace cut, and an
// allocation that failed named as one, whichever layer threw it (std::bad_alloc, c10's
// OutOfMemoryError, the CPU allocator's "can't allocate memory" enforce). The command adds
// what the user can do about it.
#pragma once

#include <exception>
#include <string>

namespace mmsp::cli {

struct FailureText {
  std::string what;            // the message, without c10's backtrace
  bool out_of_memory = false;  // an allocation failed
  bool ours = false;           // an mmsp::Error (a check of mmsp's, with its own words)
  long long bytes_asked = -1;  // the failed allocation's size, when the message gives it
};

FailureText failure_text(const std::exception& e);

}  // namespace mmsp::cli
