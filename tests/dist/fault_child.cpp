// Rank program for the fault tests; see fault_child.h.
#include "fault_child.h"

#include <ATen/ATen.h>

#include <unistd.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/heartbeat.h"
#include "mmsp/dist/mesh.h"

namespace mmsp::test {

namespace {

// "stop:K": rank K stops itself (SIGSTOP) while the others sit in all_reduces with a
// 60 s collective timeout: only the heartbeat (3 s) can end the job in seconds.
// "slow:K": rank K computes for 6 s between two collectives (twice the heartbeat
// timeout): the job must finish normally.
// "gone:0": rank 0, which serves the job's store, is killed (SIGKILL); the others compute
// 1 s while their heartbeats call the dead store every 0.3 s, then end.
int run_heartbeat_child(const std::string& mode) {
  using namespace mmsp::dist;
  const RankEnv env = rank_env_from(process_environment());
  const int culprit = std::stoi(mode.substr(mode.find(':') + 1));
  MeshOptions options;
  options.timeout = std::chrono::seconds(60);
  Mesh mesh = Mesh::connect(env, {1, 1, env.world_size}, options);
  auto activity = std::make_shared<RankActivity>();
  activity->set(7, "compute");
  HeartbeatOptions beat;
  beat.timeout = std::chrono::seconds(3);
  Heartbeat heartbeat(env, beat, activity);
  at::Tensor x = at::ones({4}, at::kDouble);
  all_reduce_(x, *mesh.world());  // everyone is up
  std::printf("rank %d: joined, pid %d\n", env.rank, static_cast<int>(::getpid()));
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (mode.rfind("gone", 0) == 0) {
    if (env.rank == culprit) ::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::printf("rank %d: computed 1 s after the store's host died\n", env.rank);
    return 0;
  }
  if (env.rank == culprit) {
    if (mode.rfind("stop", 0) == 0) {
      std::printf("rank %d: stopping\n", env.rank);
      std::fflush(stdout);
      ::raise(SIGSTOP);
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(6));
    }
  }
  try {
    for (int i = 0; i < 3; ++i) all_reduce_(x, *mesh.world());
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", env.rank, e.what());
    return 1;
  }
  std::printf("rank %d: finished\n", env.rank);
  return 0;
}

}  // namespace

int run_fault_child(const std::string& mode) {
  using namespace mmsp::dist;
  if (mode.rfind("stop:", 0) == 0 || mode.rfind("slow:", 0) == 0 || mode.rfind("gone:", 0) == 0)
    return run_heartbeat_child(mode);
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
