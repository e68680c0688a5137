// Scratch folders for tests: each a fresh folder under this test process's own root in
// TMPDIR, and the root removed with everything in it when the process exits, so that a
// run leaves nothing behind (the suite used to leave hundreds of folders in /tmp). Only
// for processes that do not fork children which exit normally (a child's exit would
// remove the parent's root).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace mmsp::test {

// This process's scratch root, made on first use, removed at exit.
inline const std::string& scratch_root() {
  struct Root {
    std::string path;
    Root() {
      std::string pattern = ::testing::TempDir() + "mmsp_test_XXXXXX";
      if (::mkdtemp(pattern.data()) != nullptr) path = pattern;
    }
    ~Root() {
      std::error_code ignored;  // nothing to report at exit
      if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
  };
  static const Root root;
  return root.path;
}

// A new empty folder under the scratch root, its name starting with `prefix`.
inline std::string scratch_dir(const std::string& prefix) {
  std::string pattern = scratch_root() + "/" + prefix + "XXXXXX";
  EXPECT_FALSE(scratch_root().empty()) << "no scratch root in " << ::testing::TempDir();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
  return pattern;
}

}  // namespace mmsp::test
