// Deterministic mutants of a JSON text for the parser mutation loops (header-only,
// used by test_plan, test_model, test_train): byte flips (random bytes: invalid
// UTF-8 too), deleted and duplicated spans (duplicate keys), deep nesting, numbers
// replaced by extreme ones, truncation. `check_mutants` runs a parser over each and
// reports every mutant that ended in anything but a result or an mmsp::Error.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mmsp/core/check.h"

namespace mmsp::test {

class JsonMutator {
 public:
  explicit JsonMutator(uint64_t seed) : state_(seed) {}

  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }

  std::string mutate(const std::string& text) {
    std::string s = text;
    const int edits = 1 + static_cast<int>(below(3));
    for (int e = 0; e < edits; ++e) s = one(s);
    return s;
  }

 private:
  std::string one(std::string s) {
    static const char* const kNumbers[] = {"-1",
                                           "0",
                                           "1e400",
                                           "-1e400",
                                           "18446744073709551616",
                                           "9223372036854775807",
                                           "-9223372036854775809",
                                           "2147483648",
                                           "0.5",
                                           "1e18",
                                           "-0",
                                           "4294967296",
                                           "true",
                                           "null",
                                           "\"x\"",
                                           "[]",
                                           "{}"};
    static const char kSyntax[] = "[]{}\",:0123456789eE.-+ \\tfnu";
    const size_t at = below(s.size() + 1);
    switch (below(8)) {
      case 0:  // a syntax character
        if (!s.empty()) s[below(s.size())] = kSyntax[below(sizeof kSyntax - 1)];
        return s;
      case 1:  // any byte (invalid UTF-8, control characters)
        if (!s.empty()) s[below(s.size())] = static_cast<char>(below(256));
        return s;
      case 2: {  // delete a span
        const size_t n = 1 + below(16);
        return s.erase(std::min(at, s.size()), n);
      }
      case 3: {  // duplicate a span (a key twice, an element twice)
        if (s.empty()) return s;
        const size_t from = below(s.size()), n = 1 + below(std::min<size_t>(64, s.size() - from));
        return s.insert(at, s.substr(from, n));
      }
      case 4: {  // deep nesting
        const size_t depth = below(2) ? 1 + below(200) : 100000 + below(900000);
        std::string open = below(2) ? "[" : "{\"k\":";
        std::string deep;
        deep.reserve(depth * open.size());
        for (size_t i = 0; i < depth; ++i) deep += open;
        return s.insert(at, deep);
      }
      case 5: {  // a number replaced by an extreme value
        const size_t digit = s.find_first_of("0123456789", at);
        if (digit == std::string::npos) return s;
        const size_t end = s.find_first_not_of("0123456789.eE+-", digit);
        return s.replace(digit, (end == std::string::npos ? s.size() : end) - digit,
                         kNumbers[below(sizeof kNumbers / sizeof kNumbers[0])]);
      }
      case 6:  // truncated
        return s.substr(0, at);
      default: {  // a key duplicated inside its object: "k": v, "k": v
        const size_t quote = s.find("\":", at);
        if (quote == std::string::npos) return s;
        const size_t start = s.rfind('"', quote == 0 ? 0 : quote - 1);
        const size_t comma = s.find_first_of(",}", quote);
        if (start == std::string::npos || comma == std::string::npos) return s;
        return s.insert(start, s.substr(start, comma - start) + ",");
      }
    }
  }

  uint64_t state_;
};

struct MutantReport {
  int mutants = 0, accepted = 0, refused = 0;
  double seconds = 0;
  std::vector<std::string> failures;  // "mutant 12: std::out_of_range: ..." (first 20 chars of it)
};

// Runs `parse` on `count` mutants of `text`; every outcome but a return or an
// mmsp::Error is a failure (a signal ends the test binary, a hang its ctest timeout).
inline MutantReport check_mutants(const std::string& text, uint64_t seed, int count,
                                  const std::function<void(const std::string&)>& parse) {
  MutantReport r;
  JsonMutator m(seed);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    const std::string mutant = m.mutate(text);
    ++r.mutants;
    try {
      parse(mutant);
      ++r.accepted;
    } catch (const mmsp::Error&) { ++r.refused; } catch (const std::exception& e) {
      r.failures.push_back("mutant " + std::to_string(i) + ": " + e.what() + "\n  input: " + mutant.substr(0, 300));
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace mmsp::test
