// Who this process is in the job: rank, world size, local rank and the rendezvous
// address, read from the variables that torchrun, mmsp-run, OpenMPI or Slurm set.
// Pure: the caller passes the environment in (cli/ reads the process's own).
#pragma once

#include <map>
#include <string>

namespace mmsp::dist {

using Environment = std::map<std::string, std::string>;

struct RankEnv {
  int rank = 0;                           // global rank, 0 .. world_size-1
  int world_size = 1;                     // number of ranks in the job
  int local_rank = 0;                     // rank on this host
  int local_world_size = 1;               // ranks on this host
  std::string master_addr = "127.0.0.1";  // host of rank 0, where the TCPStore listens
  int master_port = 29500;                // TCPStore port
  std::string gloo_interface;             // GLOO_SOCKET_IFNAME, if set: the NIC Gloo binds
  std::string launcher;                   // "torchrun" (also mmsp-run), "openmpi", "slurm", "single"
  std::string run_id;                     // MMSP_RUN_ID, if set: the job's identity in the rendezvous
};

// Reads torchrun's names first (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT; MMSP_RUN_ID), then OpenMPI's (OMPI_COMM_WORLD_*), then Slurm's
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...). With none of them: one rank.
// Throws mmsp::Error naming the variable when a value is malformed or inconsistent.
RankEnv rank_env_from(const Environment& env);

// The current process's environment as a map (used by cli/ only).
Environment process_environment();

}  // namespace mmsp::dist
