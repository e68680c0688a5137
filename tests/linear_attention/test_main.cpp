// test_linear_attention entry point: alone, the single-process kernel and layer
// tests; under `mmsp-run -n N`, every rank runs the MultiRank layer tests.
#include <gtest/gtest.h>

#include "multirank.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mmsp::test::init_multirank();
  return RUN_ALL_TESTS();
}
