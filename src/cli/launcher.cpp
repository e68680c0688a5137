// mmsp-run's engine (launcher.h, docs/launcher.md): checks the request, builds each
// rank's environment, and supervises the ranks: fork/exec each into its own process
// group, forward its output by whole prefixed lines with poll(), forward SIGINT /
// SIGTERM, and on the first failure wait --grace, then SIGTERM, then SIGKILL.
#include "launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "mmsp/core/check.h"
#include "mmsp/dist/heartbeat.h"  // kHeartbeatExitCode (a constant: no LibTorch here)

extern char** environ;

namespace mmsp::cli {
namespace {

using Clock = std::chrono::steady_clock;
using detail::concat;

// Set by us for every rank; the parent's values are dropped, never duplicated.
constexpr const char* kRankVariables[] = {"RANK",        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR", "MASTER_PORT"};
// A rank printing without newlines must not make us buffer without bound.
constexpr size_t kMaxLine = size_t{1} << 20;
// After the last rank exits, how long its children may keep its pipes open.
constexpr auto kDrainTime = std::chrono::seconds(1);

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool is_rank_variable(std::string_view entry) {
  std::string_view name = entry.substr(0, entry.find('='));
  for (const char* variable : kRankVariables)
    if (name == variable) return true;
  return false;
}

Clock::time_point after_seconds(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Our stdout may be gone (a closed pipe): keep supervising and drop the text.
void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "mmsp-run: " + message + "\n"); }

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

std::string find_executable(const std::string& name, const std::string& path_list) {
  MMSP_CHECK(!name.empty(), "PROGRAM is an empty string");
  if (name.find('/') != std::string::npos) {
    MMSP_CHECK(is_executable_file(name), "PROGRAM '", name, "' is not an executable file");
    return name;
  }
  for (size_t begin = 0;;) {
    size_t end = path_list.find(':', begin);
    std::string dir = path_list.substr(begin, end == std::string::npos ? end : end - begin);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  throw Error(concat("PROGRAM '", name, "' is not an executable found in PATH (", path_list, ")"));
}

std::string validate(const LaunchOptions& o) {
  MMSP_CHECK(o.nproc >= 1, "-n (", o.nproc, ") must be at least 1: it is the number of ranks to start");
  MMSP_CHECK(o.nnodes >= 1, "--nnodes (", o.nnodes, ") must be at least 1");
  MMSP_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank (", o.node_rank, ") must be in [0, --nnodes (",
             o.nnodes, "))");
  MMSP_CHECK(static_cast<long long>(o.nnodes) * o.nproc <= INT_MAX, "--nnodes (", o.nnodes, ") * -n (", o.nproc,
             ") is too large");
  MMSP_CHECK(!o.master_addr.empty(), "--master-addr is empty");
  MMSP_CHECK(o.master_port >= 0 && o.master_port <= 65535, "--master-port (", o.master_port,
             ") must be in [1, 65535], or 0 to pick a free one");
  MMSP_CHECK(o.nnodes == 1 || o.master_port != 0, "--master-port is required when --nnodes (", o.nnodes,
             ") > 1: every node must use the same port");
  // Another node reaching 127.0.0.1 (the default) reaches itself, never rank 0's host.
  MMSP_CHECK(
      o.nnodes == 1 || (o.master_addr != "localhost" && o.master_addr.rfind("127.", 0) != 0 && o.master_addr != "::1"),
      "--master-addr (", o.master_addr, ") is a loopback address, but --nnodes (", o.nnodes,
      ") > 1: give the address or name by which every node reaches node 0 (the host of rank 0)");
  MMSP_CHECK(o.grace_s >= 0, "--grace (", o.grace_s, ") must be >= 0 seconds");
  MMSP_CHECK(o.kill_after_s >= 0, "--kill-after (", o.kill_after_s, ") must be >= 0 seconds");
  MMSP_CHECK(!o.command.empty(), "no PROGRAM given: usage is mmsp-run -n N [options] -- PROGRAM ARGS...");
  const char* path = std::getenv("PATH");
  return find_executable(o.command.front(), path != nullptr ? path : "/bin:/usr/bin");
}

int find_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(addr.c_str(), "0", &hints, &found);
  MMSP_CHECK(rc == 0, "--master-addr '", addr, "' does not resolve: ", ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, ::freeaddrinfo);
  int error = 0;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    int port = 0;
    if (fd >= 0 && ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    }
    error = errno;
    if (fd >= 0) ::close(fd);
    if (port > 0) return port;
  }
  throw Error(concat("cannot bind a port on --master-addr '", addr, "' (", std::strerror(error),
                     "): use an address of this machine, or pass --master-port"));
}

std::string make_run_id() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
  return concat("mmsp-run:", host, ":", ::getpid(), ":", ms.count());
}

std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank,
                                          const std::vector<std::string>& parent) {
  std::vector<std::string> env;
  for (const auto& entry : parent)
    if (!is_rank_variable(entry) && (o.run_id.empty() || entry.rfind("MMSP_RUN_ID=", 0) != 0)) env.push_back(entry);
  env.push_back(concat("RANK=", o.node_rank * o.nproc + local_rank));
  env.push_back(concat("WORLD_SIZE=", o.nnodes * o.nproc));
  env.push_back(concat("LOCAL_RANK=", local_rank));
  env.push_back(concat("LOCAL_WORLD_SIZE=", o.nproc));
  env.push_back(concat("MASTER_ADDR=", o.master_addr));
  env.push_back(concat("MASTER_PORT=", o.master_port));
  if (!o.run_id.empty()) env.push_back(concat("MMSP_RUN_ID=", o.run_id));
  return env;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return concat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return concat("killed by signal ", WTERMSIG(status), " (", ::strsignal(WTERMSIG(status)), ")");
  return concat("ended with wait status ", status);
}

std::string LinePrefixer::feed(std::string_view bytes) {
  size_t scanned = partial_.size();  // earlier bytes hold no newline: don't rescan them
  partial_.append(bytes);
  if (partial_.find('\n', scanned) == std::string::npos) return partial_.size() >= kMaxLine ? finish() : std::string();
  std::string out;
  size_t begin = 0;
  for (size_t newline; (newline = partial_.find('\n', begin)) != std::string::npos; begin = newline + 1) {
    out += prefix_;
    out.append(partial_, begin, newline + 1 - begin);
  }
  partial_.erase(0, begin);
  return out;
}

std::string LinePrefixer::finish() {
  if (partial_.empty()) return {};
  std::string out = prefix_ + partial_ + "\n";
  partial_.clear();
  return out;
}

namespace {

// Signal handlers write the signal number here so that poll() wakes up (self-pipe).
int g_wake_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_wake_pipe[1], &byte, 1);
  errno = saved;
}

// Installs the handlers for the supervisor's lifetime and restores the old ones after.
class SignalWake {
 public:
  SignalWake() {
    MMSP_CHECK(::pipe2(g_wake_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "pipe: ", std::strerror(errno));
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &action, &saved_[i]);
    // A closed stdout must not kill the launcher while ranks still run.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &saved_pipe_);
  }
  ~SignalWake() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &saved_[i], nullptr);
    ::sigaction(SIGPIPE, &saved_pipe_, nullptr);
    ::close(g_wake_pipe[0]);
    ::close(g_wake_pipe[1]);
    g_wake_pipe[0] = g_wake_pipe[1] = -1;
  }

  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGCHLD};

 private:
  std::array<struct sigaction, 3> saved_{};
  struct sigaction saved_pipe_ {};
};

// The child side of fork(): become a process-group leader, wire stdio, exec.
// Our signals arrive blocked (see Supervisor::start) and are unblocked only once
// the handlers that would write to our wake pipe are gone.
[[noreturn]] void exec_rank(const char* path, char** argv, char** envp, int out_fd, int err_fd, int null_fd,
                            const sigset_t& mask, pid_t launcher) {
  // No orphans: the kernel kills the rank when mmsp-run dies, even by SIGKILL. The
  // setting survives exec; a launcher that died before it was made is caught by getppid.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(128 + SIGKILL);
  ::setpgid(0, 0);
  // Ignored dispositions survive exec; the rank must see default SIGPIPE / SIGINT.
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  // Ranks live in background process groups: reading a terminal would stop them.
  if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
  if (out_fd >= 0) ::dup2(out_fd, STDOUT_FILENO);
  if (err_fd >= 0) ::dup2(err_fd, STDERR_FILENO);
  ::execve(path, argv, envp);
  std::string message = concat("mmsp-run: cannot execute ", path, ": ", std::strerror(errno), "\n");
  write_all(STDERR_FILENO, message);
  ::_exit(127);
}

struct Stream {
  int fd = -1;  // read end of the rank's pipe; -1 once at EOF
  int target;   // where its lines go: our stdout or stderr
  LinePrefixer lines;
};

// The rank that whole lines of a rank's output name as the one whose error ended the job
// ("rank 2 stopped with an error: ...": the heartbeat's post, which every rank that ends on
// it prints); -1 when they name none.
int rank_named_as_cause(const std::string& lines) {
  static const std::string kMark = " stopped with an error: ";
  for (size_t at = lines.find(kMark); at != std::string::npos; at = lines.find(kMark, at + 1)) {
    size_t begin = at;
    while (begin > 0 && lines[begin - 1] >= '0' && lines[begin - 1] <= '9') --begin;
    if (begin == at || begin < 5 || lines.compare(begin - 5, 5, "rank ") != 0 || at - begin > 9) continue;
    return std::stoi(lines.substr(begin, at - begin));
  }
  return -1;
}

struct Rank {
  int rank = 0;  // global rank, as the prefix shows it
  pid_t pid = -1;
  bool running = false;
  int status = 0;                // waitpid() status once it has exited
  bool signalled_by_us = false;  // so the summary can tell a victim from the cause
  bool killed_stopped = false;   // it was stopped (SIGSTOP, a debugger) when the job ended
  std::vector<Stream> streams;
};

// Is the process stopped (state T or t in /proc/PID/stat)? It cannot act on SIGTERM.
bool is_stopped(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buffer[512] = {};
  const ssize_t n = ::read(fd, buffer, sizeof buffer - 1);
  ::close(fd);
  if (n <= 0) return false;
  const char* paren = std::strrchr(buffer, ')');  // the name may hold spaces and parentheses
  return paren != nullptr && paren[1] == ' ' && (paren[2] == 'T' || paren[2] == 't');
}

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, std::string program) : options_(options), program_(std::move(program)) {
    for (char** entry = environ; *entry != nullptr; ++entry) parent_env_.emplace_back(*entry);
    null_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ranks_.reserve(options.nproc);  // first_failure_ points into it
  }
  ~Supervisor() {
    if (null_fd_ >= 0) ::close(null_fd_);
  }

  int run() {
    SignalWake wake;
    for (int local = 0; local < options_.nproc && !start_failed_; ++local) start(local);
    while (any_running() || draining()) {
      wait_for_events();
      reap();
      apply_deadlines();
    }
    return finish();
  }

 private:
  bool any_running() const {
    for (const auto& r : ranks_)
      if (r.running) return true;
    return false;
  }

  bool draining() const {
    if (!drain_until_ || Clock::now() >= *drain_until_) return false;
    for (const auto& r : ranks_)
      for (const auto& s : r.streams)
        if (s.fd >= 0) return true;
    return false;
  }

  bool open_pipe(int fds[2]) { return ::pipe2(fds, O_CLOEXEC) == 0; }

  void start(int local) {
    Rank& r = ranks_.emplace_back();
    r.rank = options_.node_rank * options_.nproc + local;
    std::vector<std::string> env = rank_environment(options_, local, parent_env_);
    std::vector<std::string> args = options_.command;
    std::vector<char*> envp = c_strings(env), argv = c_strings(args);
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    bool piped = !options_.prefix || (open_pipe(out) && open_pipe(err));
    // A signal reaching the child before it drops our handlers would look to us
    // like one sent to mmsp-run: hold them until then.
    sigset_t handled, mask;
    sigemptyset(&handled);
    for (int sig : SignalWake::kSignals) sigaddset(&handled, sig);
    ::sigprocmask(SIG_BLOCK, &handled, &mask);
    const pid_t launcher = ::getpid();
    pid_t pid = piped ? ::fork() : -1;
    if (pid == 0) exec_rank(program_.c_str(), argv.data(), envp.data(), out[1], err[1], null_fd_, mask, launcher);
    int error = errno;
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    for (int fd : {out[1], err[1]})
      if (fd >= 0) ::close(fd);
    if (pid < 0) return start_failed(r, {out[0], err[0]}, error);
    ::setpgid(pid, pid);  // also done in the child: the group must exist before we signal it
    r.pid = pid;
    r.running = true;
    if (!options_.prefix) return;
    std::string prefix = concat("[rank ", r.rank, "] ");
    r.streams.push_back({out[0], STDOUT_FILENO, LinePrefixer(prefix)});
    r.streams.push_back({err[0], STDERR_FILENO, LinePrefixer(prefix)});
    for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }

  void start_failed(Rank& r, std::initializer_list<int> fds, int error) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    say(concat("cannot start rank ", r.rank, ": ", std::strerror(error)));
    start_failed_ = true;
    term_at_ = Clock::now();  // stop the ranks already started
  }

  // Blocks until output, a signal or the next deadline.
  void wait_for_events() {
    std::vector<pollfd> fds{{g_wake_pipe[0], POLLIN, 0}};
    std::vector<Stream*> owners{nullptr};
    for (auto& r : ranks_)
      for (auto& s : r.streams)
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          owners.push_back(&s);
        }
    if (::poll(fds.data(), fds.size(), poll_timeout_ms()) <= 0) return;  // timeout or EINTR
    if (fds[0].revents != 0) read_signals();
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents != 0) read_stream(*owners[i]);
  }

  int poll_timeout_ms() const {
    std::optional<Clock::time_point> next;
    for (const auto& deadline : {term_at_, kill_at_, drain_until_})
      if (deadline && (!next || *deadline < *next)) next = deadline;
    if (!next) return -1;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(ms, 0, INT_MAX));
  }

  void read_signals() {
    char bytes[64];
    for (ssize_t n; (n = ::read(g_wake_pipe[0], bytes, sizeof bytes)) > 0;)
      for (ssize_t i = 0; i < n; ++i)
        if (bytes[i] == SIGINT || bytes[i] == SIGTERM) forward(bytes[i]);
  }

  // Returns whether it read anything, so a finished rank's pipes can be drained.
  bool read_stream(Stream& s) {
    char buffer[65536];
    ssize_t n = ::read(s.fd, buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return false;
    if (n <= 0) {
      write_all(s.target, s.lines.finish());
      ::close(s.fd);
      s.fd = -1;
      return false;
    }
    const std::string lines = s.lines.feed({buffer, static_cast<size_t>(n)});
    if (named_cause_ < 0) named_cause_ = rank_named_as_cause(lines);
    write_all(s.target, lines);
    return true;
  }

  void forward(int sig) {
    say(concat("received signal ", sig, " (", ::strsignal(sig), "), forwarding it to the ranks"));
    received_signal_ = sig;
    signal_running(sig);
    term_at_.reset();  // the ranks have just been asked to stop
    if (!kill_at_) kill_at_ = after_seconds(options_.kill_after_s);
  }

  void signal_running(int sig) {
    for (auto& r : ranks_)
      if (r.running) {
        ::kill(-r.pid, sig);  // the whole group, so the rank's own children stop too
        r.signalled_by_us = true;
      }
  }

  void reap() {
    for (auto& r : ranks_) {
      int status = 0;
      if (r.running && ::waitpid(r.pid, &status, WNOHANG) == r.pid) on_exit(r, status);
    }
  }

  void on_exit(Rank& r, int status) {
    r.running = false;
    r.status = status;
    // Print the rank's last words before our verdict on it.
    for (auto& s : r.streams)
      while (s.fd >= 0 && read_stream(s)) {}
    // A rank we signalled is a victim of the teardown, not its cause.
    if (!succeeded(status) && !r.signalled_by_us && first_failure_ == nullptr) {
      first_failure_ = &r;
      say(concat("rank ", r.rank, " failed: ", describe_wait_status(status)));
      if (!kill_at_) term_at_ = after_seconds(options_.grace_s);
      kill_stopped_ranks();
    } else if (!succeeded(status) && !r.signalled_by_us && r.rank == named_cause_) {
      // The first to end ended on this rank's error (a rank with an error waits for the
      // others to read it before it exits): the job's failure is this one.
      say(concat("rank ", r.rank, " failed: ", describe_wait_status(status),
                 " (its error is the one the other ranks ended on)"));
    }
    if (!any_running()) drain_until_ = Clock::now() + kDrainTime;
  }

  // The rank whose failure the job ended on: the one the ranks' messages name as stopped
  // with an error, when it failed on its own; else the first to fail.
  const Rank* cause() const {
    for (const auto& r : ranks_)
      if (r.rank == named_cause_ && !succeeded(r.status) && !r.signalled_by_us) return &r;
    return first_failure_;
  }

  // A stopped rank (the hung one, typically) would sit out the grace and the SIGTERM:
  // it is killed at once, and the summary says it was stopped.
  void kill_stopped_ranks() {
    for (auto& r : ranks_)
      if (r.running && is_stopped(r.pid)) {
        say(concat("rank ", r.rank, " is stopped (it cannot act on SIGTERM): killing it"));
        ::kill(-r.pid, SIGKILL);
        r.signalled_by_us = true;
        r.killed_stopped = true;
      }
  }

  void apply_deadlines() {
    auto now = Clock::now();
    if (term_at_ && now >= *term_at_) {
      term_at_.reset();
      signal_running(SIGTERM);
      kill_at_ = after_seconds(options_.kill_after_s);
    }
    if (kill_at_ && now >= *kill_at_) {
      kill_at_.reset();
      signal_running(SIGKILL);
    }
  }

  int finish() {
    for (auto& r : ranks_)
      for (auto& s : r.streams)
        if (s.fd >= 0) {
          write_all(s.target, s.lines.finish());
          ::close(s.fd);
        }
    print_summary();
    if (start_failed_) return 1;  // the others' failures are our SIGTERM, not the cause
    if (first_failure_ != nullptr) return exit_code(cause()->status);
    return received_signal_ != 0 ? 128 + received_signal_ : 0;
  }

  void print_summary() const {
    const Rank* cause = this->cause();
    for (const auto& r : ranks_) {
      if (succeeded(r.status)) continue;
      const bool saw_hang = WIFEXITED(r.status) && WEXITSTATUS(r.status) == dist::kHeartbeatExitCode;
      const std::string ended_on =
          cause != first_failure_ ? concat(" (first to end: it ended on rank ", cause->rank, "'s error)") : "";
      const std::string why =
          r.killed_stopped                            ? " (it was stopped: the hung rank; killed by mmsp-run)"
          : &r == cause && cause != first_failure_    ? " (the failure: the other ranks ended on its error)"
          : &r == first_failure_ && !ended_on.empty() ? ended_on
          : &r == first_failure_ && saw_hang ? " (first to end: it found a peer hung; its message names the rank)"
          : &r == first_failure_             ? " (first failure)"
          : r.signalled_by_us                ? " (stopped by mmsp-run)"
                                             : "";
      say(concat("summary: rank ", r.rank, " ", describe_wait_status(r.status), why));
    }
  }

  const LaunchOptions& options_;
  const std::string program_;
  std::vector<std::string> parent_env_;
  int null_fd_ = -1;
  std::vector<Rank> ranks_;
  const Rank* first_failure_ = nullptr;
  int named_cause_ = -1;  // the rank the ranks' output names as stopped with an error (rank_named_as_cause)
  bool start_failed_ = false;
  int received_signal_ = 0;
  std::optional<Clock::time_point> term_at_, kill_at_, drain_until_;
};

}  // namespace

int launch(const LaunchOptions& options, const std::string& program_path) {
  MMSP_ASSERT(options.master_port > 0, "launch() needs the port chosen");
  Supervisor supervisor(options, program_path);
  return supervisor.run();
}

}  // namespace mmsp::cli
