// The mmsp tool's thread policy (src/cli/thread_policy.h): each rank takes its share of
// the cores it may run on, OMP_NUM_THREADS wins, and a malformed launcher environment
// leaves LibTorch's choice alone (the command reports it).
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "thread_policy.h"

namespace {

// Sets the given variables (nullopt: unset) for one test and restores them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

int cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(::sched_getaffinity(0, sizeof(mask), &mask), 0);
  return CPU_COUNT(&mask);
}

std::map<std::string, std::optional<std::string>> ranks_on_host(int n, std::optional<std::string> omp) {
  return {{"OMP_NUM_THREADS", omp},
          {"RANK", "0"},
          {"WORLD_SIZE", std::to_string(n)},
          {"LOCAL_RANK", "0"},
          {"LOCAL_WORLD_SIZE", std::to_string(n)},
          {"OMPI_COMM_WORLD_RANK", std::nullopt},
          {"SLURM_PROCID", std::nullopt}};
}

TEST(ThreadPolicy, EachRankTakesItsShareOfTheCores) {
  const int n = cores();
  {
    ScopedEnv env(ranks_on_host(1, std::nullopt));
    EXPECT_EQ(mmsp::cli::set_rank_threads(), n);
    EXPECT_EQ(at::get_num_threads(), n);
  }
  {
    ScopedEnv env(ranks_on_host(2 * n, std::nullopt));  // more ranks than cores: one each
    EXPECT_EQ(mmsp::cli::set_rank_threads(), 1);
    EXPECT_EQ(at::get_num_threads(), 1);
  }
  if (n >= 4) {
    ScopedEnv env(ranks_on_host(2, std::nullopt));
    EXPECT_EQ(mmsp::cli::set_rank_threads(), n / 2);
  }
}

TEST(ThreadPolicy, OmpNumThreadsWins) {
  at::set_num_threads(1);
  ScopedEnv env(ranks_on_host(1, "3"));
  EXPECT_EQ(mmsp::cli::set_rank_threads(), 0);
  EXPECT_EQ(at::get_num_threads(), 1) << "left as it was";
}

TEST(ThreadPolicy, MalformedLauncherVariablesLeaveItAlone) {
  at::set_num_threads(1);
  auto vars = ranks_on_host(2, std::nullopt);
  vars["LOCAL_WORLD_SIZE"] = "two";
  ScopedEnv env(vars);
  EXPECT_EQ(mmsp::cli::set_rank_threads(), 0);
  EXPECT_EQ(at::get_num_threads(), 1);
}

}  // namespace
