// Heartbeats through the job's TCPStore; see heartbeat.h. Three threads per rank:
// `beat` writes this rank's key every interval; `watch` reads the others' keys and
// notes, on this host's monotonic clock, when each last changed (no clock is shared
// between hosts); `judge` touches no store and catches a `watch` that has not completed
// a round for the timeout (the store's host, rank 0, stopped).
#include "mmsp/dist/heartbeat.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "mmsp/compat/quiet_c10_log.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/flag_agreement.h"
#include "mmsp/dist/startup_deadline.h"

namespace mmsp::dist {
namespace {

using Clock = std::chrono::steady_clock;
const char* const kKeyPrefix = "mmsp/heartbeat/";
const char* const kAbortKey = "mmsp/heartbeat/abort";
const char* const kAckKey = "mmsp/heartbeat/informed";  // ranks that know the job is ending
// A rank that ended with an error of its own (Heartbeat::report_error). The others give
// their own main thread kPeerErrorGrace to fail with its own message (the same bad
// batch fails every rank) before they end with this one.
const char* const kErrorKey = "mmsp/heartbeat/error";
constexpr auto kPeerErrorGrace = std::chrono::milliseconds(2000);
const char* const kDone = "done";

std::string key_of(int rank) { return kKeyPrefix + std::to_string(rank); }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::string encode_heartbeat(const HeartbeatValue& v) {
  return std::to_string(v.beats) + " " + std::to_string(v.step) + " " + v.phase;
}

HeartbeatValue decode_heartbeat(const std::string& s) {
  HeartbeatValue v;
  std::istringstream in(s);
  if (!(in >> v.beats >> v.step)) return HeartbeatValue{-1, 0, ""};
  std::getline(in >> std::ws, v.phase);
  return v;
}

std::string heartbeat_failure_message(int rank, double seconds, const HeartbeatValue& last) {
  return heartbeat_failure_message(std::vector<int>{rank}, seconds, last, JobHosts{});
}

std::string heartbeat_failure_message(const std::vector<int>& ranks, double seconds, const HeartbeatValue& last,
                                      const JobHosts& hosts) {
  char age[32];
  std::snprintf(age, sizeof age, "%.1f", seconds);
  std::string where = last.beats > 0 ? detail::concat("last seen in step ", last.step, ", phase ", last.phase)
                                     : std::string("never seen: its heartbeat did not start");
  const bool one = ranks.size() == 1;
  // Every rank of a host silent at once: the host is down or cut off, not one process.
  std::string whole_host;
  if (hosts.spans_hosts() && !ranks.empty() && hosts.ranks_on_host_of(ranks[0]) == ranks)
    whole_host = detail::concat(" (every rank of ", hosts.name_host_of(ranks[0]),
                                ": the host is down, stopped or cut off from the network)");
  return detail::concat(hosts.name_ranks(ranks), one ? " has" : " have", " not answered for ", age, " s (", where,
                        "); ", one ? "it is" : "they are", " stopped, wedged or unreachable", whole_host,
                        ". The job is ended (--heartbeat-timeout)");
}

struct Heartbeat::State {
  RankEnv env;
  JobHosts hosts;
  std::chrono::milliseconds timeout{0}, interval{0};
  std::shared_ptr<const RankActivity> activity;
  OnFailure on_failure;
  c10d::TCPStoreOptions store_options;
  c10::intrusive_ptr<c10d::TCPStore> beat_store, watch_store;

  // A fresh connection: after a failed or timed-out call a client may be out of step
  // with the server (an unread reply), so it is replaced rather than reused.
  c10::intrusive_ptr<c10d::TCPStore> connect() const {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  }

  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::atomic<bool> failed{false};
  // fail() is ending the process (a verdict of the heartbeat's, not report_error's)
  std::atomic<bool> ending{false};
  // when `watch` last completed a round of store calls (steady clock, ns)
  std::atomic<int64_t> last_round_ns{0};
  // the longest time any peer's key stood still before it changed (ns): the false-alarm margin
  std::atomic<int64_t> largest_gap_ns{0};
  std::vector<HeartbeatValue> last;                  // per rank, under mutex
  std::vector<Clock::time_point> changed;            // per rank, under mutex
  std::optional<Clock::time_point> peer_error_seen;  // watch thread only

  // The peers (not returned) whose key had stood still for longer than `threshold` at
  // `at`, by rank. The caller holds `mutex`.
  std::vector<int> silent_at(Clock::time_point at, std::chrono::nanoseconds threshold) const {
    std::vector<int> ranks;
    for (int r = 0; r < env.world_size; ++r)
      if (r != env.rank && last[r].phase != kDone && at - changed[r] > threshold) ranks.push_back(r);
    return ranks;
  }

  // The peers already silent for more than half the timeout when `watch` last completed a
  // round, as a heartbeat message ("" when none). When the store then stops answering,
  // they are what the job died of: the ranks that saw them have ended, rank 0 and its
  // store among them, before this rank (a starved one) read their verdict.
  std::string silent_before_store_lost() {
    std::lock_guard<std::mutex> lock(mutex);
    const Clock::time_point round{Clock::duration(last_round_ns.load())};
    const std::vector<int> ranks = silent_at(round, std::chrono::nanoseconds(timeout) / 2);
    if (ranks.empty()) return "";
    const int first =
        *std::min_element(ranks.begin(), ranks.end(), [&](int a, int b) { return changed[a] < changed[b]; });
    return heartbeat_failure_message(ranks, seconds_since(changed[first]), last[first], hosts) +
           " — then the job's store, which rank 0 hosts, stopped answering: the ranks that saw it have ended";
  }

  // Sleeps one interval; false when stopping.
  bool pause(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mutex);
    return !wake.wait_for(lock, d, [this] { return stopping; });
  }

  // `store_answers`: false when the store itself is what failed (no acks can come).
  // `hung`: how many ranks the message blames (they cannot acknowledge it).
  void fail(const std::string& message, bool tell_others, bool store_answers = true, int hung = 1) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopping) return;  // the rank has finished: a late round blames no one
    }
    if (failed.exchange(true)) return;
    if (on_failure) {
      on_failure(message);
      return;
    }
    ending.store(true);
    compat::quiet_c10_log_from_now();  // this message is the rank's last word, not c10's warnings after it
    std::fprintf(stderr, "mmsp: error: %s\n", message.c_str());
    std::fflush(stderr);
    // Tell the others (the abort key) and count this rank as informed (the ack key);
    // the rank that saw it, and rank 0 however it learnt it, wait at most 2 s until
    // every rank but the hung one has acknowledged: rank 0's exit takes the store with
    // it, and a rank still in a collective with rank 0 would then fail on the closed
    // connection before reading the abort key, naming no rank. Store calls may block
    // (a stopped store host), so they run on a thread of their own.
    const int64_t expected = env.world_size - hung;  // all but the hung ranks
    const bool wait_for_all = tell_others || env.rank == 0;
    const std::string addr = env.master_addr;
    const c10d::TCPStoreOptions opts = store_options;
    auto acknowledged = std::make_shared<std::atomic<bool>>(false);
    const std::string posted = message + " (seen by rank " + std::to_string(env.rank) + ")";
    std::thread([addr, opts, posted, tell_others, wait_for_all, expected, acknowledged] {
      try {
        auto store = c10::make_intrusive<c10d::TCPStore>(addr, opts);  // its own: the others are in use
        if (tell_others) store->set(kAbortKey, bytes(posted));
        int64_t n = store->add(kAckKey, 1);
        while (wait_for_all && n < expected) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          n = store->add(kAckKey, 0);
        }
      } catch (...) {}
      acknowledged->store(true);
    }).detach();
    const auto deadline = Clock::now() + std::chrono::milliseconds(wait_for_all && store_answers ? 2000
                                                                   : store_answers               ? 500
                                                                                                 : 200);
    while (!acknowledged->load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::_Exit(kHeartbeatExitCode);
  }

  void beat_loop() {
    HeartbeatValue v;
    do {
      ++v.beats;
      v.step = activity->step();
      v.phase = activity->phase();
      try {
        const compat::QuietC10Log quiet;  // a store gone is the watcher's to report, once
        if (!beat_store) beat_store = connect();
        beat_store->set(key_of(env.rank), bytes(encode_heartbeat(v)));
      } catch (const std::exception&) {
        beat_store.reset();  // slow or gone: the others judge by our key, not by this
      }
    } while (pause(interval));
    ++v.beats;
    v.phase = kDone;
    try {
      const compat::QuietC10Log quiet;
      if (!beat_store) beat_store = connect();
      beat_store->set(key_of(env.rank), bytes(encode_heartbeat(v)));
    } catch (const std::exception&) {}
  }

  // One round: the abort key, then every other rank's key. False when the store failed.
  bool watch_round() {
    std::vector<std::pair<int, HeartbeatValue>> seen;
    std::optional<std::string> abort, error;
    try {
      // A failed call (the store's host died) is reported by this rank, once: not c10's
      // warning with its backtrace, which it logs before it throws.
      const compat::QuietC10Log quiet;
      if (!watch_store) watch_store = connect();
      if (watch_store->check({kAbortKey})) {
        abort = text(watch_store->get(kAbortKey));
      } else {
        if (watch_store->check({kErrorKey})) error = text(watch_store->get(kErrorKey));
        for (int r = 0; r < env.world_size; ++r) {
          if (r == env.rank || !watch_store->check({key_of(r)})) continue;
          seen.emplace_back(r, decode_heartbeat(text(watch_store->get(key_of(r)))));
        }
      }
    } catch (const std::exception&) {
      watch_store.reset();
      compat::quiet_c10_log_from_now();  // the judge says what happened, once
      return false;
    }
    if (abort) {
      fail(*abort, false);
      return true;
    }
    if (error) {
      const auto now = Clock::now();
      if (!peer_error_seen) peer_error_seen = now;
      if (now - *peer_error_seen >= kPeerErrorGrace) {
        fail(*error, false);
        return true;
      }
    }
    last_round_ns.store(Clock::now().time_since_epoch().count());
    std::string failure;
    int hung_count = 1;
    {
      std::lock_guard<std::mutex> lock(mutex);
      const auto now = Clock::now();
      for (const auto& [r, v] : seen)
        if (v.beats >= 0 && v.beats != last[r].beats) {
          if (last[r].beats > 0) {  // gaps between two beats, not the wait for the first
            const int64_t gap = std::chrono::duration_cast<std::chrono::nanoseconds>(now - changed[r]).count();
            if (gap > largest_gap_ns.load()) largest_gap_ns.store(gap);
          }
          last[r] = v, changed[r] = now;
        }
      // Once one rank is past the timeout, every rank silent for more than half of it
      // goes into the same message: a host cut off loses all its ranks at once.
      const std::vector<int> over = silent_at(now, timeout);
      if (!over.empty()) {
        const int first = over.front();
        const std::vector<int> hung = silent_at(now, std::chrono::nanoseconds(timeout) / 2);
        failure = heartbeat_failure_message(hung, std::chrono::duration<double>(now - changed[first]).count(),
                                            last[first], hosts);
        hung_count = static_cast<int>(hung.size());
      }
    }
    if (!failure.empty()) fail(failure, true, true, hung_count);
    return true;
  }

  void watch_loop() {
    do {
      if (!watch_round()) {
        std::lock_guard<std::mutex> lock(mutex);
        if (last[0].phase == kDone) return;  // rank 0 finished and took its store with it
      }
    } while (pause(interval));
  }

  // No successful round of `watch` for longer than the timeout (a call stuck or failing):
  // rank 0, which serves the store, is not answering. This thread touches no store.
  void judge_loop() {
    while (pause(interval)) {
      const Clock::time_point t{Clock::duration(last_round_ns.load())};
      const double age = seconds_since(t);
      if (age * 1000 <= timeout.count()) continue;
      HeartbeatValue seen;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (last[0].phase == kDone) return;
        seen = last[0];
      }
      // Peers silent before the store went are the cause (a verdict this rank missed).
      if (const std::string before = silent_before_store_lost(); !before.empty()) {
        fail(before, true, false);
        return;
      }
      // Across hosts the store's whole host is what stopped answering: its ranks are named.
      const std::vector<int> gone = hosts.spans_hosts() ? hosts.ranks_on_host_of(0) : std::vector<int>{0};
      fail(heartbeat_failure_message(gone, age, seen, hosts) +
               " — the job's store, which rank 0 hosts, does not respond",
           true, false);
      return;
    }
  }
};

Heartbeat::Heartbeat(const RankEnv& env, const HeartbeatOptions& options, std::shared_ptr<const RankActivity> activity,
                     OnFailure on_failure) {
  MMSP_CHECK(options.timeout.count() > 0, "--heartbeat-timeout must be positive, got ",
             options.timeout.count() / 1000.0, " s");
  if (env.world_size <= 1) return;
  MMSP_ASSERT(activity, "Heartbeat needs a RankActivity");
  auto s = std::make_shared<State>();
  s->env = env;
  s->hosts = options.hosts;
  s->timeout = options.timeout;
  s->interval = options.interval.count() > 0
                    ? options.interval
                    : std::clamp(options.timeout / 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  s->activity = std::move(activity);
  s->on_failure = std::move(on_failure);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env.master_port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = options.timeout;
  s->store_options = opts;
  try {
    // The store host may stop right after the rendezvous: the connections are bounded too.
    StartupDeadline deadline(env.rank, options.timeout, env.master_addr + ":" + std::to_string(env.master_port),
                             "opening the heartbeat's connections to rank 0's store");
    s->beat_store = s->connect();
    s->watch_store = s->connect();
  } catch (const std::exception& e) {
    throw Error(detail::concat("rank ", env.rank, " could not open its heartbeat connection to the job's store at ",
                               env.master_addr, ":", env.master_port, ": ", e.what()));
  }
  const auto start = Clock::now();
  s->last.assign(env.world_size, HeartbeatValue{});
  s->changed.assign(env.world_size, start);
  s->last_round_ns.store(start.time_since_epoch().count());
  state_ = s;
  beat_ = std::thread([s, done = beat_done_] {
    s->beat_loop();
    done->store(true);
  });
  watch_ = std::thread([s] { s->watch_loop(); });
  judge_ = std::thread([s] { s->judge_loop(); });
}

void Heartbeat::report_error(const std::string& message) {
  if (!state_ || state_->failed.exchange(true)) return;
  State& s = *state_;
  const std::string posted = "rank " + std::to_string(s.env.rank) + " stopped with an error: " + message;
  const int64_t others = s.env.world_size - 1;
  const bool host = s.env.rank == 0;  // its exit takes the store: it waits until the others have read
  auto finished = std::make_shared<std::atomic<bool>>(false);
  const std::string addr = s.env.master_addr;
  const c10d::TCPStoreOptions opts = s.store_options;
  // Store calls may block (the store host stopped): on a thread of their own, bounded below.
  std::thread([addr, opts, posted, host, others, finished] {
    try {
      const compat::QuietC10Log quiet;  // the store may be gone: this rank has said what happened
      auto store = c10::make_intrusive<c10d::TCPStore>(addr, opts);
      if (!store->check({kErrorKey})) store->set(kErrorKey, bytes(posted));
      // Until every other rank has read it (acknowledged) or ended on its own ("done").
      const auto settled = [&] {
        int64_t n = store->add(kAckKey, 0);
        for (int r = 1; r <= others; ++r)
          if (store->check({key_of(r)}) && decode_heartbeat(text(store->get(key_of(r)))).phase == kDone) ++n;
        return n >= others;
      };
      while (host && !settled()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } catch (...) {}
    finished->store(true);
  }).detach();
  const auto deadline = Clock::now() + (host ? kPeerErrorGrace + s.interval + std::chrono::milliseconds(1000)
                                             : std::chrono::milliseconds(500));
  while (!finished->load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

namespace {
// The first of `keys` in the store whose value does not start with `skip_prefix`, read
// from a thread of its own within `limit`: its index and value ({-1, ""} when none, or
// when the store does not answer in time: its host may be gone, and a store call waits
// for the client's own timeout).
std::pair<int, std::string> read_first_key(const std::string& addr, const c10d::TCPStoreOptions& opts,
                                           std::vector<std::string> keys, const std::string& skip_prefix,
                                           std::chrono::milliseconds limit) {
  auto found = std::make_shared<std::pair<int, std::string>>(-1, "");
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread([addr, opts, keys, skip_prefix, found, finished] {
    try {
      const compat::QuietC10Log quiet;  // a store gone means "no post": the caller says what happened
      auto store = c10::make_intrusive<c10d::TCPStore>(addr, opts);
      for (size_t i = 0; i < keys.size(); ++i)
        if (found->first < 0 && store->check({keys[i]})) {
          std::string t = text(store->get(keys[i]));
          if (skip_prefix.empty() || t.rfind(skip_prefix, 0) != 0) *found = {static_cast<int>(i), std::move(t)};
        }
    } catch (...) {}
    finished->store(true);
  }).detach();
  const auto deadline = Clock::now() + limit;
  while (!finished->load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return finished->load() ? *found : std::pair<int, std::string>{-1, ""};
}
}  // namespace

Heartbeat::PeerFailure Heartbeat::peer_failure() const {
  if (!state_) return {};
  const State& s = *state_;
  // another rank's post, not this one's
  auto [key, message] = read_first_key(s.env.master_addr, s.store_options, {kErrorKey, kAbortKey},
                                       "rank " + std::to_string(s.env.rank) + " ", std::chrono::milliseconds(1000));
  return PeerFailure{std::move(message), key == 1};
}

void Heartbeat::await_verdict() const {
  if (!state_ || !state_->ending.load()) return;
  // fail() waits at most 2 s for the acknowledgements, then exits
  const auto deadline = Clock::now() + std::chrono::milliseconds(4000);
  while (Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void Heartbeat::join_verdict(const std::string& message) {
  if (!state_) return;
  state_->fail(message, false);  // returns when the watcher got there first: it is ending the process
  await_verdict();
}

SilentPeers Heartbeat::silent_peers(std::chrono::milliseconds window) const {
  SilentPeers silent;
  if (!state_) return silent;
  State& s = *state_;
  // The watcher reads the keys once per interval: a beat a peer posted just before it
  // died may be seen only now. One interval first, so that such a beat is not taken
  // for a sign of life.
  std::this_thread::sleep_for(s.interval + std::chrono::milliseconds(200));
  const auto since = Clock::now();
  std::this_thread::sleep_for(window);
  // No round of reads finished in the window: the store is what is gone, and with it
  // rank 0's host; the other peers cannot be judged.
  const Clock::time_point round{Clock::duration(s.last_round_ns.load())};
  if (round < since) {
    silent.store_lost = true;
    silent.ranks = s.hosts.known() ? s.hosts.ranks_on_host_of(0) : std::vector<int>{0};
    return silent;
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  for (int r = 0; r < s.env.world_size; ++r)
    if (r != s.env.rank && s.last[r].phase != kDone && s.changed[r] <= since) silent.ranks.push_back(r);
  return silent;
}

std::string Heartbeat::name_silent(const SilentPeers& silent) const {
  if (!state_ || silent.ranks.empty()) return "";
  State& s = *state_;
  if (silent.store_lost) {
    if (std::string before = s.silent_before_store_lost(); !before.empty()) return before;
    return detail::concat(s.hosts.name_ranks(silent.ranks), silent.ranks.size() == 1 ? " is" : " are",
                          " gone: the job's store, which rank 0 hosts, stopped answering");
  }
  const bool whole_host = s.hosts.spans_hosts() && s.hosts.ranks_on_host_of(silent.ranks[0]) == silent.ranks;
  return detail::concat(s.hosts.name_ranks(silent.ranks), " stopped answering (died or hung: ",
                        silent.ranks.size() == 1 ? "its heartbeat stands" : "their heartbeats stand", " still",
                        whole_host ? "; every rank of that host: the host is down or cut off" : "", ")");
}

double Heartbeat::largest_gap_seconds() const {
  return state_ ? static_cast<double>(state_->largest_gap_ns.load()) / 1e9 : 0.0;
}

double Heartbeat::timeout_seconds() const {
  return state_ ? static_cast<double>(state_->timeout.count()) / 1000.0 : 0.0;
}

Heartbeat::~Heartbeat() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  // `beat` posts "done" first, bounded: with the store's host gone the post waits for the
  // store client's own timeout, and this rank must end now (its thread ends with the
  // process). `watch` may sit in such a call too: it is never waited on.
  const auto until = Clock::now() + state_->interval + std::chrono::milliseconds(1000);
  while (!beat_done_->load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool beat_ended = beat_done_->load();
  if (beat_.joinable()) beat_ended ? beat_.join() : beat_.detach();
  if (judge_.joinable()) judge_.join();
  // A rank that ends with an error of its own (a collective that failed because the
  // rank another one declared hung was killed) still says what the job died of, read
  // over `beat`'s connection (a closed one fails at once), when the store still answered it.
  if (!state_->failed.load() && beat_ended && state_->beat_store) {
    try {
      if (state_->beat_store->check({kAbortKey})) {
        const std::string message = text(state_->beat_store->get(kAbortKey));
        std::fprintf(stderr, "mmsp: error: %s\n", message.c_str());
        std::fflush(stderr);
      }
    } catch (const std::exception&) {}
  }
  if (watch_.joinable()) watch_.detach();
}

}  // namespace mmsp::dist
