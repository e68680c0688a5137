// Errors. MMSP_CHECK is for what a user can fix: the message names the value, the
// rule and, where useful, a hint; MMSP_FAIL is the same where the code has already
// decided that the input is wrong (a branch, a catch). MMSP_ASSERT is for mmsp's own bugs.
// All throw mmsp::Error so that a rank reports and exits instead of aborting.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mmsp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace mmsp

#define MMSP_CHECK(cond, ...)                                              \
  do {                                                                     \
    if (!(cond)) throw ::mmsp::Error(::mmsp::detail::concat(__VA_ARGS__)); \
  } while (0)

// [[noreturn]] in effect: a throw expression, so the compiler knows control ends here.
#define MMSP_FAIL(...) throw ::mmsp::Error(::mmsp::detail::concat(__VA_ARGS__))

#define MMSP_ASSERT(cond, ...)                                                                                       \
  do {                                                                                                               \
    if (!(cond))                                                                                                     \
      throw ::mmsp::Error(::mmsp::detail::concat("internal error (please report): ", #cond, " failed at ", __FILE__, \
                                                 ":", __LINE__, ": ", ##__VA_ARGS__));                               \
  } while (0)
