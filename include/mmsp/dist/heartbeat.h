// Hang detection: every rank keeps a heartbeat key in the job's c10d TCPStore from a
// background thread and watches the other ranks' keys from another; a rank whose key
// has not changed for `timeout` (stopped, wedged, swapped out) ends the job on every
// rank with "rank K has not answered for N s (last seen in step S, phase P)". What a
// rank is doing (step, phase) comes from a RankActivity its owner updates. The
// collective timeout (MeshOptions) stays for everything else.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mmsp/dist/job_hosts.h"
#include "mmsp/dist/rank_env.h"

namespace mmsp::dist {

// Exit status of a rank ended by the heartbeat (its own watcher or another rank's).
constexpr int kHeartbeatExitCode = 3;

// Step and phase of this rank, written by the main thread (trainer), read by the
// heartbeat thread. `phase` must outlive the object (a string literal).
class RankActivity {
 public:
  void set(int64_t step, const char* phase) {
    step_.store(step, std::memory_order_relaxed);
    phase_.store(phase, std::memory_order_relaxed);
  }
  void set_phase(const char* phase) { phase_.store(phase, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }
  const char* phase() const { return phase_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> step_{0};
  std::atomic<const char*> phase_{"start-up"};
};

struct HeartbeatOptions {
  // A rank whose heartbeat is older than this ends the job (--heartbeat-timeout). Beats
  // come from a thread of their own every timeout / 10, which compute does not block.
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};
  // How often a rank beats and reads the others' beats; 0: timeout / 10, within
  // [50 ms, 1 s].
  std::chrono::milliseconds interval{0};
  // Every rank's host (Mesh::hosts()): in a job that spans hosts, messages say where the
  // silent ranks are, and a host cut off is named as one.
  JobHosts hosts;
};

// What a heartbeat key holds: "<beats> <step> <phase>", or "<beats> <step> done".
struct HeartbeatValue {
  int64_t beats = 0;
  int64_t step = 0;
  std::string phase;
};
std::string encode_heartbeat(const HeartbeatValue& value);
// Anything malformed gives beats = -1 (a damaged key counts as no beat).
HeartbeatValue decode_heartbeat(const std::string& text);

// "rank 2 has not answered for 3.4 s (last seen in step 7, phase forward); ..."; several
// ranks of one host: "ranks 2, 3 on host node1 (10.0.0.2) have not answered ...".
std::string heartbeat_failure_message(int rank, double seconds, const HeartbeatValue& last);
std::string heartbeat_failure_message(const std::vector<int>& ranks, double seconds, const HeartbeatValue& last,
                                      const JobHosts& hosts);

// What the heartbeat knows of peers that are gone (Heartbeat::silent_peers).
struct SilentPeers {
  std::vector<int> ranks;   // silent during the window (or, when store_lost, rank 0's host's ranks)
  bool store_lost = false;  // the job's store (rank 0's host) did not answer during the window
};

class Heartbeat {
 public:
  // What happens on a detected hang; the default prints `message` to stderr and ends
  // the process with kHeartbeatExitCode (the main thread may be inside a collective
  // that would wait for the collective timeout).
  using OnFailure = std::function<void(const std::string& message)>;

  // Connects two store clients of its own to env's TCPStore (which Mesh::connect
  // opened) and starts beating and watching. One rank: does nothing.
  Heartbeat(const RankEnv& env, const HeartbeatOptions& options, std::shared_ptr<const RankActivity> activity,
            OnFailure on_failure = {});
  // Marks this rank's heartbeat "done" (so that ranks still finishing never blame a
  // rank that returned) and stops the threads; when another rank has ended the job
  // (its message is in the store), prints that message too.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  // This rank is ending with an error (bad data, a file it cannot read): the message is
  // posted where every other rank's watcher reads it within one interval, so they end
  // too (exit kHeartbeatExitCode) naming this rank, instead of waiting in a collective
  // until --timeout. Rank 0 (the store's host) waits up to 2 s for them to read it.
  void report_error(const std::string& message);
  // What another rank posted as the job's end (its own error, or a hang it saw); an
  // empty message when none (or the store does not answer within 1 s): the cause to name
  // when this rank's own failure is only its consequence (a collective whose peer has
  // exited because it declared a third rank hung).
  struct PeerFailure {
    std::string message;
    bool hang = false;  // a rank declared others hung (this rank then ends with kHeartbeatExitCode too)
  };
  PeerFailure peer_failure() const;
  // For a main thread that caught an error: when this rank's heartbeat has already
  // declared a hang (its watcher waits for the others to read the verdict, then ends the
  // process), waits for that, bounded, so that the verdict and its exit status come
  // first; returns at once otherwise.
  void await_verdict() const;
  // This rank's failure is the consequence of a hang another rank declared
  // (peer_failure().hang) that this rank's watcher has not read yet (a loaded machine):
  // ends the process as the watcher would have: says `message`, acknowledges it, and
  // exits kHeartbeatExitCode. Returns only with an OnFailure of the caller's.
  void join_verdict(const std::string& message);
  // The peers whose heartbeat did not change during `window` (waited here, after one
  // interval for the watcher to catch up with beats posted before a death) and
  // that did not return: the ones that died (SIGKILL, a crash) or hung, to name when a
  // collective failed because a peer is gone and no launcher says which.
  // When the store itself did not answer during the window, the peers cannot be told
  // apart: the answer is rank 0's host (its ranks), with store_lost set.
  SilentPeers silent_peers(std::chrono::milliseconds window) const;
  // "ranks 2, 3 stopped answering ...": the sentence naming what silent_peers found
  // (their host in a job that spans hosts), "" when it found none.
  std::string name_silent(const SilentPeers& silent) const;
  // The longest a peer's heartbeat stood still, as this rank saw it (seconds; 0 for
  // one rank): timeout_seconds() / this is the margin before a false alarm.
  double largest_gap_seconds() const;
  double timeout_seconds() const;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread beat_, watch_, judge_;
  // Set by `beat` as it ends: the destructor waits for it a bounded time only (its last
  // post may wait for a store whose host is gone).
  std::shared_ptr<std::atomic<bool>> beat_done_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace mmsp::dist
