// Fault tests: real ranks under mmsp-run where one rank dies or hangs. The job
// must end, non-zero, naming the culprit, within seconds; never hang.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <sys/wait.h>

using ::testing::HasSubstr;

namespace {

struct Outcome {
  int status = -1;     // exit status of mmsp-run
  double seconds = 0;  // wall time
  std::string output;  // stdout and stderr of all ranks
};

Outcome run(const std::string& launcher_args, const std::string& mode) {
  const std::string cmd = std::string(MMSP_RUN_PATH) + " " + launcher_args + " -- " +
                          TEST_DIST_PATH + " --fault-child " + mode + " 2>&1";
  auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(cmd.c_str(), "r");
  Outcome out;
  char buffer[4096];
  while (pipe && std::fgets(buffer, sizeof buffer, pipe)) out.output += buffer;
  const int raw = pipe ? pclose(pipe) : -1;
  out.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace

TEST(FaultTest, LauncherStopsTheJobWhenARankExits) {
  Outcome out = run("-n 3", "exit");
  EXPECT_NE(out.status, 0) << out.output;
  EXPECT_LT(out.seconds, 15.0) << out.output;
  EXPECT_THAT(out.output, HasSubstr("rank 1 failed: exited with status 3")) << out.output;
  // The survivors saw the dead peer themselves and said so.
  EXPECT_THAT(out.output, HasSubstr("a peer rank died")) << out.output;
}

TEST(FaultTest, StuckPeerEndsInTimeoutError) {
  Outcome out = run("-n 2 --grace 3", "hang");
  EXPECT_NE(out.status, 0) << out.output;
  EXPECT_LT(out.seconds, 15.0) << out.output;
  EXPECT_THAT(out.output, HasSubstr("rank 0: error: all_reduce on group world (2 ranks) failed"))
      << out.output;
  EXPECT_THAT(out.output, HasSubstr("timeout 2 s")) << out.output;
}
