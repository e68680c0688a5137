// The job's rendezvous on rank 0's c10d TCPStore, before any process group exists:
// every rank shows that it belongs to the same run (a run id) and waits, within one
// deadline, until every rank of the world has arrived. Errors name the missing ranks
// or the other run; building the groups is left to Mesh.
#pragma once

#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "mmsp/dist/flag_agreement.h"
#include "mmsp/dist/job_hosts.h"
#include "mmsp/dist/rank_env.h"

namespace c10d {
class Store;
}

namespace mmsp::dist {

class StartupDeadline;

// The run id this rank joins with: env.run_id (MMSP_RUN_ID, which mmsp-run sets), else
// "MASTER_ADDR:MASTER_PORT/WORLD_SIZE".
std::string run_id_of(const RankEnv& env);

// What the ranks have once they have met: rank 0's store, and every rank's host with the
// address its Gloo listens on (job_hosts.h).
struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  JobHosts hosts;
};

// Opens the TCPStore at env.master_addr:env.master_port (rank 0 serves it), checks the
// run id that rank 0 wrote there against this rank's, registers this rank, and returns
// once all env.world_size ranks have registered. Everything ends within `timeout` of
// the call (plus a second on rank 0, so that the others read the verdict):
//   "rank 3 did not join within 10 s (3 of 4 ranks joined run '...' at host:port) ..."
//   "rank 1 of run 'A' reached the rendezvous of run 'B' at host:port ..."
// as mmsp::Error, never a c10 backtrace. Each rank also posts `flags`; once all have
// joined, every rank compares them and, when they differ, every rank throws the same
// error naming each differing flag and its values by rank (flag_agreement.h).
// `deadline` (optional) is told each stage, for its message if the store stops answering.
// A non-empty `refusal` (this rank cannot start) ends every rank, once all have joined,
// with "rank R cannot start: <refusal>" (the lowest such rank's).
// Each rank also posts its host (job_hosts.h): a rank whose GLOO_SOCKET_IFNAME names no
// interface here is refused the same way, and in a job that spans hosts a rank that
// could listen only on loopback is refused on every rank, naming the interface to use.
Rendezvous join_rendezvous(const RankEnv& env, std::chrono::milliseconds timeout, const AgreedFlags& flags = {},
                           StartupDeadline* deadline = nullptr, const std::string& refusal = "");

}  // namespace mmsp::dist
