// How an exception that ends a command reads; see failure_text.h.
#include "failure_text.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <new>

#include "mmsp/core/check.h"

namespace mmsp::cli {

FailureText failure_text(const std::exception& e) {
  FailureText t;
  t.ours = dynamic_cast<const Error*>(&e) != nullptr;
  t.what = e.what();
  // c10's messages carry a C++ backtrace: the first line is the message.
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) t.what = c10->what_without_backtrace();
  t.out_of_memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                    dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                    t.what.find("can't allocate memory") != std::string::npos ||
                    t.what.find("not enough memory") != std::string::npos;
  // c10's CPU allocator: "... you tried to allocate 10456473664 bytes. Error code 12 ..."
  const std::string asked = "you tried to allocate ";
  if (const size_t at = t.what.find(asked); t.out_of_memory && at != std::string::npos)
    t.bytes_asked = std::strtoll(t.what.c_str() + at + asked.size(), nullptr, 10);
  return t;
}

}  // namespace mmsp::cli
