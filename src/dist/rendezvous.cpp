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

Rendezvous join_rendezvous(const RankEnv& env, std::chrono::milliseconds timeout, const AgreedFlags& flags,
                           StartupDeadline* watchdog, const std::string& refusal_in) {
  const auto deadline = Clock::now() + timeout;
  const auto stage = [watchdog](const char* what) {
    if (watchdog) watchdog->stage(what);
  };
  const std::string where = concat(env.master_addr, ":", env.master_port);
  const std::string id = run_id_of(env);
  // This rank's host and route, before the store: a GLOO_SOCKET_IFNAME that names no
  // interface here is this rank's refusal (every rank hears it); a MASTER_ADDR that does
  // not resolve here is said instead of the store's own error, below.
  std::string refusal = refusal_in;
  std::string host_error;
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
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env.master_port);
  opts.isServer = env.rank == 0;
  opts.numWorkers = env.world_size;
  opts.waitWorkers = false;  // we wait ourselves, with a deadline and the names of the missing
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  stage(env.rank == 0 ? "opening the job's store" : StartupDeadline::kConnecting);
  try {
    const compat::QuietC10Log quiet;  // the failure is reported below, in one line
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  } catch (const std::exception& e) {
    if (!host_error.empty()) throw Error(host_error);
    if (env.rank == 0)
      throw Error(concat("rank 0 could not serve the rendezvous at ", where, ": ", short_message(e),
                         " (is another job using MASTER_PORT ", env.master_port, "? give each job its own port)"));
    throw Error(concat("rank 0 did not join within ", seconds(timeout), " s: rank ", env.rank,
                       " found no rendezvous at ", where, " (", short_message(e),
                       "); is rank 0 started, with the same MASTER_ADDR and MASTER_PORT?"));
  }

  const std::string mine = "mmsp/" + id + "/";
  Rendezvous met;
  try {
    // The run id: rank 0 writes it, every other rank must find its own there.
    stage("reading the run id from rank 0's store");
    if (env.rank == 0) {
      store->set("mmsp/run_id", bytes(id));
    } else {
      while (!store->check({"mmsp/run_id"})) {
        MMSP_CHECK(Clock::now() < deadline, "rank ", env.rank, " of run '", id, "' found a store at ", where,
                   " without an mmsp run id within ", seconds(timeout),
                   " s: another program is using MASTER_PORT ", env.master_port);
        std::this_thread::sleep_for(kPoll);
      }
      const std::string theirs = text(store->get("mmsp/run_id"));
      MMSP_CHECK(theirs == id, "rank ", env.rank, " of run '", id, "' reached the rendezvous of run '", theirs,
                 "' at ", where, ": two jobs on one MASTER_PORT; give each job its own port (or set MMSP_RUN_ID "
                 "the same on every rank of one job)");
    }
    const int64_t seen = store->add(mine + "join/" + std::to_string(env.rank), 1);
    MMSP_CHECK(seen == 1, "rank ", env.rank, " joined run '", id, "' at ", where,
               " a second time: two processes were started as RANK ", env.rank,
               " (two jobs with one MASTER_PORT and run id? give each its own port or MMSP_RUN_ID)");
    store->set(mine + "flags/" + std::to_string(env.rank), bytes(encode_flags(flags)));
    store->set(mine + "refusal/" + std::to_string(env.rank), bytes(refusal));
    store->set(mine + "host/" + std::to_string(env.rank), bytes(encode_rank_host(host)));
    store->add(mine + "joined", 1);
    stage("waiting for every rank to join");
    while (store->add(mine + "joined", 0) < env.world_size) {
      if (store->check({mine + "failed"})) {
        const std::string verdict = text(store->get(mine + "failed"));
        if (env.rank == 0) std::this_thread::sleep_for(kVerdictLinger);
        throw Error(verdict);
      }
      if (Clock::now() >= deadline) {
        std::vector<int> missing;
        for (int r = 0; r < env.world_size; ++r)
          if (!store->check({mine + "join/" + std::to_string(r)})) missing.push_back(r);
        const std::string verdict =
            concat(rank_list(missing), " did not join within ", seconds(timeout), " s (",
                   env.world_size - static_cast<int>(missing.size()), " of ", env.world_size, " ranks joined run '",
                   id, "' at ", where, "): ", missing.size() == 1 ? "was it" : "were they",
                   " started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE? (--timeout bounds the wait)");
        if (!store->check({mine + "failed"})) store->set(mine + "failed", bytes(verdict));
        if (env.rank == 0) std::this_thread::sleep_for(kVerdictLinger);
        throw Error(verdict);
      }
      std::this_thread::sleep_for(kPoll);
    }
    // Every rank has posted its flags: each compares them all and reaches the same verdict.
    stage("comparing the ranks' flags");
    std::vector<AgreedFlags> all(env.world_size);
    for (int r = 0; r < env.world_size; ++r)
      if (!decode_flags(text(store->get(mine + "flags/" + std::to_string(r))), all[r])) all[r] = {{"(unreadable)", ""}};
    std::string disagreement;
    for (int r = 0; r < env.world_size && disagreement.empty(); ++r) {
      const std::string theirs = text(store->get(mine + "refusal/" + std::to_string(r)));
      if (!theirs.empty()) disagreement = concat("rank ", r, " cannot start: ", theirs);
    }
    // Every rank's host: the same records give the same listening addresses, or the same
    // refusal, on every rank; the flags' message then says where each rank is.
    std::vector<RankHost> hosts(static_cast<size_t>(env.world_size));
    std::string host_verdict;
    for (int r = 0; r < env.world_size && host_verdict.empty(); ++r)
      if (!decode_rank_host(text(store->get(mine + "host/" + std::to_string(r))), hosts[static_cast<size_t>(r)]))
        host_verdict = concat("rank ", r, " sent an unreadable host record (another mmsp version?)");
    if (host_verdict.empty()) {
      try {
        met.hosts = JobHosts(std::move(hosts));
      } catch (const Error& e) {
        host_verdict = e.what();
      }
    }
    const JobHosts& named = met.hosts;
    if (disagreement.empty())
      disagreement = flag_disagreement(all, [&named](const std::vector<int>& ranks) { return named.name_ranks(ranks); });
    if (disagreement.empty()) disagreement = host_verdict;
    store->add(mine + "flags_read", 1);
    if (!disagreement.empty()) {
      // Rank 0 serves the store until every rank has read the flags (bounded).
      if (env.rank == 0) {
        const auto until = Clock::now() + std::chrono::seconds(2);
        while (store->add(mine + "flags_read", 0) < env.world_size && Clock::now() < until)
          std::this_thread::sleep_for(kPoll);
      }
      throw Error(disagreement);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(concat("rank ", env.rank, " lost the rendezvous at ", where,
                       " before every rank joined (rank 0 ended?): ", short_message(e)));
  }
  met.store = store;
  return met;
}

}  // namespace mmsp::dist
