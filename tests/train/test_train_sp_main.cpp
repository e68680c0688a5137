// test_train_sp entry point: alone, one rank; under `mmsp-run -n N`, every rank
// runs the MultiRank training tests.
#include <gtest/gtest.h>

#include "multirank.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mmsp::test::init_multirank();
  return RUN_ALL_TESTS();
}
