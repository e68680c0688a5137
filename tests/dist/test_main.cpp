// test_dist entry point. Alone it runs the single-process tests; under
// `mmsp-run -n N` it joins the ranks and runs the MultiRank* tests on every rank.
// `--fault-child MODE` is the rank program the fault tests start (see test_fault.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "fault_child.h"
#include "multirank.h"

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--fault-child") == 0) return mmsp::test::run_fault_child(argv[i + 1]);
  ::testing::InitGoogleTest(&argc, argv);
  mmsp::test::init_multirank();
  return RUN_ALL_TESTS();
}
