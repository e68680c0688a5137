// Rendezvous with a run id and a bounded wait for every rank; see rendezvous.h.
// Keys: "mmsp/run_id" (rank 0), "mmsp/<id>/join/<rank>" (each rank, an add() counter
// that exposes a rank started twice), "mmsp/<id>/joined" (the count),
// "mmsp/<id>/failed" (the first verdict of a rank that gave up, read by the others),
// "mmsp/<id>/host/<rank>" (each rank's host, job_hosts.h).
#include "mmsp/dist/rendezvous.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Exception.h>

#include <thread>
#include <vector>

#include "mmsp/compat/quiet_c10_log.h"
#include "mmsp/core/check.h"
#include "mmsp/dist/startup_deadline.h"

namespace mmsp::dist {
namespace {

using Clock = std::chrono::steady_clock;
using detail::concat;
constexpr auto kPoll = std::chrono::milliseconds(50);
// How long rank 0 keeps serving after a verdict (its own or another rank's), so that
// every rank still polling reads it instead of finding the store gone.
constexpr auto kVerdictLinger = std::chrono::seconds(1);

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// c10 errors carry a backtrace in what(): keep the first line of the short form.
std::string short_message(const std::exception& e) {
  std::string m = e.what();
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) m = c10->what_without_backtrace();
  return m.substr(0, m.find('\n'));
}

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream out;
  out << static_cast<double>(t.count()) / 1000.0;
  return out.str();
}

}  // namespace

std::string run_id_of(const RankEnv& env) {
  if (!env.run_id.empty()) return env.run_id;
  return concat(env.master_addr, ":", env.master_port, "/", env.world_size);
}

namespace {

// One rank's view of the rendezvous: where it is, the run's keys, and when it gives up.
struct Joining {
  const RankEnv& env;
  std::chrono::milliseconds timeout;
  Clock::time_point deadline;
  std::string where, id, mine;  // MASTER_ADDR:PORT, the run id, "mmsp/<id>/"
  std::string key(const char* what, int rank) const { return mine + what + "/" + std::to_string(rank); }
};

// This rank's host and route, before the store: a GLOO_SOCKET_IFNAME that names no
// interface here is this rank's refusal (every rank hears it); a MASTER_ADDR that does
// not resolve here is said instead of the store's own error (host_error).
RankHost describe_host(const RankEnv& env, std::string& refusal, std::string& host_error) {
  RankHost host;
  try {
    host = describe_this_rank(env.master_addr, env.master_port, env.gloo_interface);
  } catch (const Error& e) {
    host_error = concat("rank ", env.rank, " (host ", this_host().hostname, "): ", e.what());
    const HostIdentity id_here = this_host();
    host.key = id_here.key;
    host.hostname = id_here.hostname;
    if (refusal.empty()) refusal = e.what();
  }
  return host;
}

c10::intrusive_ptr<c10d::Store> open_store(const Joining& j, const std::string& host_error) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(j.env.master_port);
  opts.isServer = j.env.rank == 0;
  opts.numWorkers = j.env.world_size;
  opts.waitWorkers = false;  // we wait ourselves, with a deadline and the names of the missing
  opts.timeout = j.timeout;
  try {
    const compat::QuietC10Log quiet;  // the failure is reported below, in one line
    return c10::make_intrusive<c10d::TCPStore>(j.env.master_addr, opts);
  } catch (const std::exception& e) {
    if (!host_error.empty()) throw Error(host_error);
    if (j.env.rank == 0)
      throw Error(concat("rank 0 could not serve the rendezvous at ", j.where, ": ", short_message(e),
                         " (is another job using MASTER_PORT ", j.env.master_port, "? give each job its own port)"));
    throw Error(concat("rank 0 did not join within ", seconds(j.timeout), " s: rank ", j.env.rank,
                       " found no rendezvous at ", j.where, " (", short_message(e),
                       "); is rank 0 started, with the same MASTER_ADDR and MASTER_PORT?"));
  }
}

// The run id: rank 0 writes it, every other rank must find its own there.
void check_run_id(c10d::Store& store, const Joining& j) {
  const RankEnv& env = j.env;
  if (env.rank == 0) {
    store.set("mmsp/run_id", bytes(j.id));
    return;
  }
  while (!store.check({"mmsp/run_id"})) {
    MMSP_CHECK(Clock::now() < j.deadline, "rank ", env.rank, " of run '", j.id, "' found a store at ", j.where,
               " without an mmsp run id within ", seconds(j.timeout), " s: another program is using MASTER_PORT ",
               env.master_port);
    std::this_thread::sleep_for(kPoll);
  }
  const std::string theirs = text(store.get("mmsp/run_id"));
  MMSP_CHECK(theirs == j.id, "rank ", env.rank, " of run '", j.id, "' reached the rendezvous of run '", theirs, "' at ",
             j.where,
             ": two jobs on one MASTER_PORT; give each job its own port (or set MMSP_RUN_ID "
             "the same on every rank of one job)");
}

// Ends a failed rendezvous on this rank. Rank 0 serves the store a moment longer, so
// that every rank still polling reads the verdict instead of finding the store gone.
[[noreturn]] void give_up(const Joining& j, const std::string& verdict) {
  if (j.env.rank == 0) std::this_thread::sleep_for(kVerdictLinger);
  throw Error(verdict);
}

// Posts this rank's flags, refusal and host, then waits for every rank to have posted
// theirs, or for another rank's verdict, or for the deadline (naming the missing ranks).
void post_and_wait(c10d::Store& store, const Joining& j, const AgreedFlags& flags, const std::string& refusal,
                   const RankHost& host) {
  const RankEnv& env = j.env;
  const int64_t seen = store.add(j.key("join", env.rank), 1);
  MMSP_CHECK(seen == 1, "rank ", env.rank, " joined run '", j.id, "' at ", j.where,
             " a second time: two processes were started as RANK ", env.rank,
             " (two jobs with one MASTER_PORT and run id? give each its own port or MMSP_RUN_ID)");
  store.set(j.key("flags", env.rank), bytes(encode_flags(flags)));
  store.set(j.key("refusal", env.rank), bytes(refusal));
  store.set(j.key("host", env.rank), bytes(encode_rank_host(host)));
  store.add(j.mine + "joined", 1);
  while (store.add(j.mine + "joined", 0) < env.world_size) {
    if (store.check({j.mine + "failed"})) give_up(j, text(store.get(j.mine + "failed")));
    if (Clock::now() >= j.deadline) {
      std::vector<int> missing;
      for (int r = 0; r < env.world_size; ++r)
        if (!store.check({j.key("join", r)})) missing.push_back(r);
      const std::string verdict =
          concat(rank_list(missing), " did not join within ", seconds(j.timeout), " s (",
                 env.world_size - static_cast<int>(missing.size()), " of ", env.world_size, " ranks joined run '", j.id,
                 "' at ", j.where, "): ", missing.size() == 1 ? "was it" : "were they",
                 " started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE? (--timeout bounds the wait)");
      if (!store.check({j.mine + "failed"})) store.set(j.mine + "failed", bytes(verdict));
      give_up(j, verdict);
    }
    std::this_thread::sleep_for(kPoll);
  }
}

// Every rank has posted: each reads them all and reaches the same verdict ("" to go
// on): a rank's refusal, then the flags' disagreement, then the hosts'. The hosts go
// into `hosts` (the same records give the same listening addresses on every rank).
std::string read_verdict(c10d::Store& store, const Joining& j, JobHosts& hosts_out) {
  const int world = j.env.world_size;
  std::vector<AgreedFlags> all(world);
  for (int r = 0; r < world; ++r)
    if (!decode_flags(text(store.get(j.key("flags", r))), all[r])) all[r] = {{"(unreadable)", ""}};
  std::string disagreement;
  for (int r = 0; r < world && disagreement.empty(); ++r) {
    const std::string theirs = text(store.get(j.key("refusal", r)));
    if (!theirs.empty()) disagreement = concat("rank ", r, " cannot start: ", theirs);
  }
  std::vector<RankHost> hosts(static_cast<size_t>(world));
  std::string host_verdict;
  for (int r = 0; r < world && host_verdict.empty(); ++r)
    if (!decode_rank_host(text(store.get(j.key("host", r))), hosts[static_cast<size_t>(r)]))
      host_verdict = concat("rank ", r, " sent an unreadable host record (another mmsp version?)");
  if (host_verdict.empty()) {
    try {
      hosts_out = JobHosts(std::move(hosts));
    } catch (const Error& e) { host_verdict = e.what(); }
  }
  // The flags' message says where each rank is.
  const JobHosts& named = hosts_out;
  if (disagreement.empty())
    disagreement = flag_disagreement(all, [&named](const std::vector<int>& ranks) { return named.name_ranks(ranks); });
  return disagreement.empty() ? host_verdict : disagreement;
}

}  // namespace

Rendezvous join_rendezvous(const RankEnv& env, std::chrono::milliseconds timeout, const AgreedFlags& flags,
                           StartupDeadline* watchdog, const std::string& refusal_in) {
  const auto stage = [watchdog](const char* what) {
    if (watchdog) watchdog->stage(what);
  };
  const std::string where = concat(env.master_addr, ":", env.master_port), id = run_id_of(env);
  const Joining j{env, timeout, Clock::now() + timeout, where, id, "mmsp/" + id + "/"};
  std::string refusal = refusal_in, host_error;
  const RankHost host = describe_host(env, refusal, host_error);
  stage(env.rank == 0 ? "opening the job's store" : StartupDeadline::kConnecting);
  const c10::intrusive_ptr<c10d::Store> store = open_store(j, host_error);
  Rendezvous met;
  try {
    stage("reading the run id from rank 0's store");
    check_run_id(*store, j);
    stage("waiting for every rank to join");
    post_and_wait(*store, j, flags, refusal, host);
    stage("comparing the ranks' flags");
    const std::string verdict = read_verdict(*store, j, met.hosts);
    store->add(j.mine + "flags_read", 1);
    if (!verdict.empty()) {
      // Rank 0 serves the store until every rank has read the flags (bounded).
      if (env.rank == 0) {
        const auto until = Clock::now() + std::chrono::seconds(2);
        while (store->add(j.mine + "flags_read", 0) < env.world_size && Clock::now() < until)
          std::this_thread::sleep_for(kPoll);
      }
      throw Error(verdict);
    }
  } catch (const Error&) { throw; } catch (const std::exception& e) {
    throw Error(concat("rank ", env.rank, " lost the rendezvous at ", where,
                       " before every rank joined (rank 0 ended?): ", short_message(e)));
  }
  met.store = store;
  return met;
}

}  // namespace mmsp::dist
