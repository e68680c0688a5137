// test_dist entry point. Alone it runs the single-process tests; under
// `mmsp-run -n N` it joins the ranks and runs the MultiRank* tests on every rank.
// `--fault-child MODE` is the rank program the fault tests start (see test_fault.cpp).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <string>

#include "fault_child.h"
#include "mmsp/dist/rank_env.h"
#include "multirank_env.h"

namespace mmsp::test {
namespace {
dist::RankEnv g_env;
c10::intrusive_ptr<c10d::Store> g_store;
int g_mesh_counter = 0;
}  // namespace

const dist::RankEnv& rank_env() { return g_env; }

dist::Mesh make_mesh(const dist::MeshShape& shape) {
  dist::MeshOptions options;
  options.timeout = std::chrono::seconds(60);
  return dist::Mesh::create(g_store, g_env, shape, options,
                            "test-mesh-" + std::to_string(g_mesh_counter++));
}

}  // namespace mmsp::test

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--fault-child") == 0) return mmsp::test::run_fault_child(argv[i + 1]);

  ::testing::InitGoogleTest(&argc, argv);
  at::set_num_threads(1);
  using namespace mmsp;
  test::g_env = dist::rank_env_from(dist::process_environment());
  // Alone, the multi-rank suites run as one rank: its groups never touch a store.
  if (test::g_env.world_size > 1)
    test::g_store = dist::Mesh::open_store(test::g_env, std::chrono::seconds(60));
  return RUN_ALL_TESTS();
}
