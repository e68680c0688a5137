// Tests of mmsp-run: its pure pieces in-process (line prefixing, rank environment,
// PATH lookup, validation), then the built launcher against real `sh` ranks: the
// variables each rank sees, whole prefixed lines, teardown after a failure, signal
// forwarding and usage errors. Output and exit status are captured via fork/exec.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "launcher.h"
#include "mmsp/core/check.h"

namespace mmsp::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "mmsp-run-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return fs::path(path_) / name; }

 private:
  std::string path_;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Running, sleeping or stopped; a zombie is dead (init may take a while to reap an orphan).
bool is_alive(pid_t pid) {
  std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  size_t name_end = stat.rfind(')');
  return name_end != std::string::npos && name_end + 2 < stat.size() && stat[name_end + 2] != 'Z';
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines = lines_of(text);
  std::sort(lines.begin(), lines.end());
  return lines;
}

using Env = std::vector<std::pair<std::string, std::string>>;

// One run of the built mmsp-run; `args` is shell text, `env` is added to ours, and
// a non-zero `max_open_files` limits its descriptors (to make a rank fail to start).
class Launcher {
 public:
  explicit Launcher(const std::string& args, const Env& env = {}, rlim_t max_open_files = 0) : start_(Clock::now()) {
    pid_ = ::fork();
    if (pid_ == 0) exec_launcher(args, env, max_open_files);
  }

  int wait() {  // mmsp-run's exit status, or 128 + signal like a shell
    int status = 0;
    ::waitpid(pid_, &status, 0);
    seconds_ = std::chrono::duration<double>(Clock::now() - start_).count();
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  pid_t pid() const { return pid_; }
  double seconds() const { return seconds_; }
  std::string out() const { return read_text(dir_ / "out"); }
  std::string err() const { return read_text(dir_ / "err"); }

 private:
  [[noreturn]] void exec_launcher(const std::string& args, const Env& env, rlim_t max_open_files) {
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    int out = ::open((dir_ / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = ::open((dir_ / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::close(out);
    ::close(err);
    if (max_open_files > 0) {
      rlimit limit{max_open_files, max_open_files};
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
    std::string command = std::string("exec '") + MMSP_RUN_PATH + "' " + args;
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(126);
  }

  TempDir dir_;
  Clock::time_point start_;
  pid_t pid_ = -1;
  double seconds_ = 0;
};

struct Outcome {
  int status;
  std::string out, err;
  double seconds;
};

Outcome run_launcher(const std::string& args, const Env& env = {}, rlim_t max_open_files = 0) {
  Launcher launcher(args, env, max_open_files);
  int status = launcher.wait();
  return {status, launcher.out(), launcher.err(), launcher.seconds()};
}

// ---- in-process: the pure pieces ----

TEST(LinePrefixer, LinesSplitAcrossFeedsComeOutWholeAndTheTailOnFinish) {
  LinePrefixer lines("[rank 7] ");
  EXPECT_EQ(lines.feed("ab"), "");
  EXPECT_EQ(lines.feed("c\n\nde"), "[rank 7] abc\n[rank 7] \n");
  EXPECT_EQ(lines.feed("f\ng"), "[rank 7] def\n");
  EXPECT_EQ(lines.finish(), "[rank 7] g\n");
  EXPECT_EQ(lines.finish(), "");
}

TEST(LinePrefixer, LineOfOneMiBWithoutNewlineIsEmittedInsteadOfBuffered) {
  LinePrefixer lines("[rank 0] ");
  std::string out = lines.feed(std::string(size_t{1} << 20, 'x'));
  EXPECT_EQ(out.size(), (size_t{1} << 20) + 10);
  EXPECT_EQ(out.rfind("[rank 0] x", 0), 0u);
}

TEST(LaunchEnvironment, Node1Of3With2RanksReplacesInheritedRankVariables) {
  LaunchOptions options;
  options.nproc = 2;
  options.nnodes = 3;
  options.node_rank = 1;
  options.master_addr = "10.0.0.1";
  options.master_port = 29500;
  std::vector<std::string> env = rank_environment(options, 1, {"PATH=/bin", "RANK=99", "MASTER_PORT=1", "KEEP=yes"});
  std::set<std::string> got(env.begin(), env.end());
  std::set<std::string> want = {"PATH=/bin",
                                "KEEP=yes",
                                "RANK=3",
                                "WORLD_SIZE=6",
                                "LOCAL_RANK=1",
                                "LOCAL_WORLD_SIZE=2",
                                "MASTER_ADDR=10.0.0.1",
                                "MASTER_PORT=29500"};
  EXPECT_EQ(got, want);
  EXPECT_EQ(env.size(), want.size());
}

TEST(FindExecutable, SkipsNonExecutableEntriesInPathOrderLikeExecvp) {
  TempDir dir;
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  std::ofstream(dir / "a/prog") << "#!/bin/sh\n";
  std::ofstream(dir / "b/prog") << "#!/bin/sh\n";
  fs::permissions(dir / "b/prog", fs::perms::owner_all);
  std::string path_list = (dir / "a").string() + ":" + (dir / "b").string();
  EXPECT_EQ(find_executable("prog", path_list), (dir / "b/prog").string());
  try {
    find_executable("mmsp_no_such_prog", path_list);
    FAIL() << "expected mmsp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'mmsp_no_such_prog'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(find_executable((dir / "a/prog").string(), path_list), Error);
}

TEST(DescribeWaitStatus, NamesExitStatusAndSignalOfRealChildren) {
  pid_t exits = ::fork();
  if (exits == 0) ::_exit(3);
  pid_t killed = ::fork();
  if (killed == 0) ::raise(SIGKILL);
  int status = 0;
  ::waitpid(exits, &status, 0);
  EXPECT_EQ(describe_wait_status(status), "exited with status 3");
  ::waitpid(killed, &status, 0);
  EXPECT_EQ(describe_wait_status(status), "killed by signal 9 (Killed)");
}

TEST(LaunchValidate, EachBadValueIsNamedInTheError) {
  LaunchOptions good;
  good.nproc = 2;
  good.command = {"sh", "-c", "true"};
  EXPECT_NE(validate(good).find("sh"), std::string::npos);
  const std::vector<std::pair<void (*)(LaunchOptions&), std::string>> cases = {
      {[](LaunchOptions& o) { o.nproc = 0; }, "-n (0)"},
      {[](LaunchOptions& o) { o.nnodes = 0; }, "--nnodes (0)"},
      {[](LaunchOptions& o) { o.node_rank = 1; }, "--node-rank (1)"},
      {[](LaunchOptions& o) { o.master_port = 70000; }, "--master-port (70000)"},
      {[](LaunchOptions& o) { o.nnodes = 2; }, "--master-port is required"},
      {[](LaunchOptions& o) { o.nnodes = 2, o.master_port = 29500; },
       "--master-addr (127.0.0.1) is a loopback address, but --nnodes (2) > 1"},
      {[](LaunchOptions& o) { o.nnodes = 2, o.master_port = 29500, o.master_addr = "localhost"; },
       "--master-addr (localhost) is a loopback address"},
      {[](LaunchOptions& o) { o.grace_s = -1; }, "--grace (-1)"},
      {[](LaunchOptions& o) { o.kill_after_s = -1; }, "--kill-after (-1)"},
      {[](LaunchOptions& o) { o.command.clear(); }, "no PROGRAM"},
  };
  for (const auto& [mutate, needle] : cases) {
    LaunchOptions bad = good;
    mutate(bad);
    try {
      validate(bad);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); }
  }
}

TEST(FindFreePort, LoopbackPortIsInRangeAndBindable) {
  int port = find_free_port("127.0.0.1");
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  EXPECT_THROW(find_free_port("mmsp-no-such-host.invalid"), Error);
}

// ---- the built mmsp-run with real ranks ----

TEST(MmspRun, ThreeRanksSeeTorchrunVariablesAndOnePort) {
  Outcome r =
      run_launcher("-n 3 -- sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT'");
  ASSERT_EQ(r.status, 0) << r.err;
  std::regex pattern(R"(\[rank (\d)\] (\d) 3 (\d) 3 127\.0\.0\.1 (\d+))");
  std::set<int> ranks;
  std::set<std::string> ports;
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << line;
    EXPECT_EQ(m[1], m[2]) << line;  // prefix shows RANK
    EXPECT_EQ(m[2], m[3]) << line;  // one node: RANK == LOCAL_RANK
    ranks.insert(std::stoi(m[1]));
    ports.insert(m[4]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  ASSERT_EQ(ports.size(), 1u) << "ranks disagree on MASTER_PORT";
  int port = std::stoi(*ports.begin());
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

TEST(MmspRun, Node1Of3With2RanksGetsGlobalRanksAndGivenAddress) {
  Outcome r = run_launcher(
      "-n 2 --nnodes 3 --node-rank 1 --master-addr 10.1.2.3 --master-port 29555 -- "
      "sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out),
            (std::vector<std::string>{"[rank 2] 2 6 0 2 10.1.2.3 29555", "[rank 3] 3 6 1 2 10.1.2.3 29555"}));
}

TEST(MmspRun, ParentEnvironmentPassesThroughAndInheritedRankIsReplaced) {
  Outcome r =
      run_launcher("-n 1 -- sh -c 'echo $RANK $MMSP_TEST_VALUE'", {{"RANK", "99"}, {"MMSP_TEST_VALUE", "kept"}});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] 0 kept\n");
}

TEST(MmspRun, StdoutAndStderrArePrefixedOntoTheMatchingStream) {
  Outcome r = run_launcher("-n 2 -- sh -c 'echo out$RANK; echo err$RANK >&2'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"[rank 0] out0", "[rank 1] out1"}));
  EXPECT_EQ(sorted_lines(r.err), (std::vector<std::string>{"[rank 0] err0", "[rank 1] err1"}));
}

TEST(MmspRun, PartialLastLineIsFlushedAsItsOwnLine) {
  Outcome r = run_launcher("-n 2 -- sh -c 'printf \"first\\nno-newline$RANK\"'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"[rank 0] first", "[rank 0] no-newline0", "[rank 1] first",
                                                           "[rank 1] no-newline1"}));
  EXPECT_EQ(r.out.back(), '\n');
}

TEST(MmspRun, FourRanksOf500LinesAndA100KBLineStayWholeAndInOrder) {
  Outcome r = run_launcher(
      "-n 4 -- sh -c 'i=0; while [ $i -lt 500 ]; do echo r$RANK n$i; i=$((i+1)); done; "
      "head -c 100000 /dev/zero | tr \"\\0\" x; echo \" long$RANK\"'");
  ASSERT_EQ(r.status, 0) << r.err;
  std::regex short_line(R"(\[rank (\d)\] r(\d) n(\d+))");
  std::map<int, int> next;  // rank -> the line number it must print next
  for (const std::string& line : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, short_line)) {
      EXPECT_EQ(m[1], m[2]) << line;
      int rank = std::stoi(m[1]);
      EXPECT_EQ(std::stoi(m[3]), next[rank]++) << line;
      continue;
    }
    // std::regex recurses per character: check the 100 KB line by hand.
    ASSERT_GE(line.size(), 9u) << line;
    int rank = line[6] - '0';
    std::string want =
        "[rank " + std::to_string(rank) + "] " + std::string(100000, 'x') + " long" + std::to_string(rank);
    ASSERT_EQ(line, want) << "a line was cut or mixed: " << line.substr(0, 80);
    EXPECT_EQ(next[rank], 500) << "rank " << rank << "'s long line came before its short ones ended";
  }
  EXPECT_EQ(next, (std::map<int, int>{{0, 500}, {1, 500}, {2, 500}, {3, 500}}));
  EXPECT_EQ(lines_of(r.out).size(), 4u * 501u);
}

TEST(MmspRun, Rank1Exit3StopsTheOthersAfterGraceWithin15s) {
  Outcome r = run_launcher("-n 3 -- sh -c 'if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep 60'");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_GE(r.seconds, 2.0) << "the others were stopped before --grace (2 s) ran out";
  EXPECT_NE(r.err.find("mmsp-run: rank 1 failed: exited with status 3\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 0 killed by signal 15 (Terminated) (stopped by mmsp-run)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 2 killed by signal 15"), std::string::npos) << r.err;
}

// Rank 0 has an error of its own and waits until the others have read it (its exit takes
// the store); rank 1 ends first, on it (status 3), naming rank 0 as mmsp's ranks do. The
// job's failure, its status and the summary are rank 0's, not the first to end's.
TEST(MmspRun, TheRankWhoseErrorTheOthersEndedOnIsNamedNotTheFirstToEnd) {
  Outcome r = run_launcher(
      "-n 3 -- sh -c 'if [ $RANK = 1 ]; then sleep 0.2; "
      "echo \"mmsp: error: rank 0 stopped with an error: data.jsonl:1: video 0: bad\" >&2; exit 3; fi; "
      "if [ $RANK = 0 ]; then echo \"mmsp train: error: data.jsonl:1: video 0: bad\" >&2; sleep 0.8; exit 2; fi; "
      "sleep 60'");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("mmsp-run: rank 1 failed: exited with status 3\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mmsp-run: rank 0 failed: exited with status 2 (its error is the one the other ranks ended "
                       "on)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("summary: rank 0 exited with status 2 (the failure: the other ranks ended on its error)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("summary: rank 1 exited with status 3 (first to end: it ended on rank 0's error)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("(first failure)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 2 killed by signal 15 (Terminated) (stopped by mmsp-run)"), std::string::npos) << r.err;
}

TEST(MmspRun, RankKilledBySignal9IsReportedAndExitIs137) {
  Outcome r = run_launcher("-n 2 --grace 0.2 -- sh -c 'if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(r.status, 128 + 9) << r.err;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_NE(r.err.find("rank 0 failed: killed by signal 9 (Killed)"), std::string::npos) << r.err;
}

TEST(MmspRun, RankIgnoringSigtermIsKilledAfterKillAfter) {
  Outcome r = run_launcher(
      "-n 2 --grace 0.2 --kill-after 0.5 -- "
      "sh -c 'if [ $RANK = 1 ]; then exit 5; fi; trap \"\" TERM; sleep 60'");
  EXPECT_EQ(r.status, 5) << r.err;
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_NE(r.err.find("rank 0 killed by signal 9 (Killed) (stopped by mmsp-run)"), std::string::npos) << r.err;
}

TEST(MmspRun, ChildrenOfAStoppedRankAreStoppedWithIt) {
  TempDir dir;
  std::string pid_file = (dir / "child.pid").string();
  Outcome r = run_launcher(
      "-n 2 --grace 0.1 -- sh -c 'if [ $RANK = 1 ]; then sleep 0.3; exit 1; fi; "
      "sleep 60 & echo $! > " +
      pid_file + "; wait'");
  EXPECT_EQ(r.status, 1) << r.err;
  pid_t child = std::stoi(read_text(pid_file));
  bool gone = false;  // SIGTERM is delivered asynchronously: give it a moment
  for (int i = 0; i < 40 && !gone; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(50)))
    gone = !is_alive(child);
  EXPECT_TRUE(gone) << "rank 0's child " << child << " outlived it: SIGTERM missed its process group";
  if (!gone) ::kill(child, SIGKILL);
  EXPECT_LT(r.seconds, 1.2) << "waited for a pipe held open by a leftover child";
}

TEST(MmspRun, RankFinishingWithinGraceIsNotSignalled) {
  Outcome r = run_launcher("-n 2 --grace 5 -- sh -c 'if [ $RANK = 1 ]; then exit 4; fi; sleep 0.5'");
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_LT(r.seconds, 4.0) << "waited for the whole grace although all ranks had exited";
  EXPECT_EQ(r.err.find("rank 0"), std::string::npos) << r.err;
}

TEST(MmspRun, SigtermToTheLauncherReachesEveryRank) {
  Launcher launcher("-n 2 -- sh -c 'trap \"echo got TERM; exit 0\" TERM; echo ready; sleep 60 & wait'");
  for (int i = 0; i < 200 && lines_of(launcher.out()).size() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(lines_of(launcher.out()).size(), 2u) << "ranks did not start: " << launcher.err();
  ::kill(launcher.pid(), SIGTERM);
  EXPECT_EQ(launcher.wait(), 128 + SIGTERM) << launcher.err();
  EXPECT_LT(launcher.seconds(), 15.0);
  EXPECT_EQ(sorted_lines(launcher.out()),
            (std::vector<std::string>{"[rank 0] got TERM", "[rank 0] ready", "[rank 1] got TERM", "[rank 1] ready"}));
}

TEST(MmspRun, SigintToTheLauncherStopsRanksAndExits130) {
  Launcher launcher("-n 2 -- sh -c 'echo ready; sleep 60'");
  for (int i = 0; i < 200 && lines_of(launcher.out()).size() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(lines_of(launcher.out()).size(), 2u) << "ranks did not start: " << launcher.err();
  ::kill(launcher.pid(), SIGINT);
  EXPECT_EQ(launcher.wait(), 128 + SIGINT) << launcher.err();
  EXPECT_LT(launcher.seconds(), 15.0);
  std::string err = launcher.err();
  EXPECT_NE(err.find("rank 1 killed by signal 2 (Interrupt) (stopped by mmsp-run)"), std::string::npos) << err;
  EXPECT_EQ(err.find("failed:"), std::string::npos) << "a rank we interrupted is not a failure: " << err;
}

TEST(MmspRun, RankThatCannotStartStopsTheStartedOnesAndExits1) {
  // 64 descriptors: each running rank keeps two pipe ends, so one of 1000 cannot start.
  Outcome r = run_launcher("-n 1000 -- sh -c 'sleep 60'", {}, 64);
  EXPECT_EQ(r.status, 1) << r.err.substr(0, 400);
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_NE(r.err.find("cannot start rank"), std::string::npos) << r.err.substr(0, 400);
  EXPECT_NE(r.err.find("rank 0 killed by signal 15 (Terminated) (stopped by mmsp-run)"), std::string::npos)
      << r.err.substr(0, 400);
}

TEST(MmspRun, AllRanksExit0GivesExit0AndNoMessages) {
  Outcome r = run_launcher("-n 3 -- true");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
}

TEST(MmspRun, NoPrefixLetsRanksWriteRawLines) {
  Outcome r = run_launcher("-n 2 --no-prefix -- sh -c 'echo raw$RANK'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"raw0", "raw1"}));
}

TEST(MmspRun, BadUsageExits2NamingTheValueAndStartsNothing) {
  TempDir dir;
  std::string not_executable = (dir / "not_executable").string();
  std::ofstream(not_executable) << "#!/bin/sh\necho started\n";
  const std::string program = " -- sh -c 'echo started'";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"-n 0" + program, "-n (0) must be at least 1"},
      {"-n 2", "no PROGRAM given"},
      {"-n 2 -- mmsp_no_such_program", "'mmsp_no_such_program' is not an executable"},
      {"-n 2 -- " + not_executable, "'" + not_executable + "' is not an executable file"},
      {"-n 2 --master-port 70000" + program, "--master-port (70000)"},
      {"-n 2 --nnodes 2 --node-rank 2 --master-port 29500" + program, "--node-rank (2)"},
      {"-n 2 --nnodes 2 --master-port 29500" + program, "--master-addr (127.0.0.1) is a loopback address"},
      {"-n 2 --nnodes 2" + program, "--master-port is required"},
      {"-n 2 --bogus" + program, "unknown option '--bogus'"},
      {"-n two" + program, "two"},
      {program, "--nproc-per-node is required"},
  };
  for (const auto& [args, needle] : cases) {
    Outcome r = run_launcher(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

}  // namespace
}  // namespace mmsp::cli
