// test_attention entry point: alone, the single-process kernel tests; under
// `mmsp-run -n N`, every rank runs the MultiRank scheme tests.
#include <gtest/gtest.h>

#include "multirank.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mmsp::test::init_multirank();
  return RUN_ALL_TESTS();
}
