// How every suite reads an error: the message of the mmsp::Error that `f` throws, or
// "(no error)" when it returns, so that a failed HasSubstr says that nothing was thrown.
// Header-only: the unit binaries that link no other test support include it too.
#pragma once

#include <string>
#include <utility>

#include "mmsp/core/check.h"

namespace mmsp::test {

template <typename F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) { return e.what(); }
  return "(no error)";
}

}  // namespace mmsp::test
