// Rank program for the fault tests; see fault_child.h.
#include "fault_child.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <unistd.h>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/mesh.h"

namespace mmsp::test {

int run_fault_child(const std::string& mode) {
  using namespace mmsp::dist;
  const RankEnv env = rank_env_from(process_environment());
  MeshOptions options;
  options.timeout = std::chrono::seconds(mode == "hang" ? 2 : 30);
  Mesh mesh = Mesh::connect(env, {1, 1, env.world_size}, options);
  at::Tensor x = at::ones({4}, at::kDouble);
  all_reduce_(x, *mesh.world());  // everyone is up
  std::printf("rank %d: joined\n", env.rank);
  std::fflush(stdout);
  if (env.rank == 1) {
    if (mode == "exit") {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      _exit(3);
    }
    std::this_thread::sleep_for(std::chrono::seconds(60));  // "hang": never joins
    return 0;
  }
  try {
    for (int i = 0; i < 1000; ++i) all_reduce_(x, *mesh.world());
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", env.rank, e.what());
    return 1;
  }
  std::fprintf(stderr, "rank %d: the collectives finished although rank 1 is gone\n", env.rank);
  return 0;
}

}  // namespace mmsp::test
