// The entry point of the multi-rank test binaries (test_model_sp, test_<family>,
// test_train_sp): alone, one rank; under `mmsp-run -n N`, every rank runs the MultiRank*
// cases together (multirank.h joins them).
#include <gtest/gtest.h>

#include "multirank.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mmsp::test::init_multirank();
  return RUN_ALL_TESTS();
}
