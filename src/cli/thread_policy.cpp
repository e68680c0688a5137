// A rank's share of its host's cores; see thread_policy.h.
#include "thread_policy.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <thread>

#include "mmsp/dist/rank_env.h"

namespace mmsp::cli {
namespace {

int usable_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof(mask), &mask) == 0) return std::max(1, CPU_COUNT(&mask));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

int set_rank_threads() {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return 0;
  int ranks_here = 1;
  try {
    ranks_here = std::max(1, dist::rank_env_from(dist::process_environment()).local_world_size);
  } catch (const std::exception&) {
    return 0;  // the command names the bad variable when it reads the environment
  }
  const int threads = std::max(1, usable_cores() / ranks_here);
  at::set_num_threads(threads);
  return threads;
}

}  // namespace mmsp::cli
