// Parsing of the launcher variables into a RankEnv; see rank_env.h.
#include "mmsp/dist/rank_env.h"

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "mmsp/core/check.h"

extern char** environ;

namespace mmsp::dist {
namespace {

std::optional<std::string> lookup(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

int parse_int(const std::string& name, const std::string& text, int min_value) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  MMSP_CHECK(errno == 0 && end != text.c_str() && *end == '\0' && value >= min_value && value <= 1 << 30,
             "environment variable ", name, "='", text, "' must be an integer >= ", min_value);
  return static_cast<int>(value);
}

int int_or(const Environment& env, const std::string& name, int fallback, int min_value) {
  auto text = lookup(env, name);
  return text ? parse_int(name, *text, min_value) : fallback;
}

// Slurm writes SLURM_TASKS_PER_NODE as e.g. "4(x2),3"; the local count is the
// first figure, which is right for homogeneous allocations.
int slurm_tasks_per_node(const Environment& env, int fallback) {
  auto text = lookup(env, "SLURM_NTASKS_PER_NODE");
  if (text) return parse_int("SLURM_NTASKS_PER_NODE", *text, 1);
  text = lookup(env, "SLURM_TASKS_PER_NODE");
  if (!text) return fallback;
  return parse_int("SLURM_TASKS_PER_NODE", text->substr(0, text->find_first_of("(,")), 1);
}

}  // namespace

RankEnv rank_env_from(const Environment& env) {
  RankEnv out;
  if (lookup(env, "RANK") || lookup(env, "WORLD_SIZE")) {
    MMSP_CHECK(lookup(env, "RANK") && lookup(env, "WORLD_SIZE"),
               "RANK and WORLD_SIZE must be set together (torchrun / mmsp-run convention)");
    out.launcher = "torchrun";
    out.rank = int_or(env, "RANK", 0, 0);
    out.world_size = int_or(env, "WORLD_SIZE", 1, 1);
    out.local_rank = int_or(env, "LOCAL_RANK", out.rank, 0);
    out.local_world_size = int_or(env, "LOCAL_WORLD_SIZE", out.world_size, 1);
  } else if (lookup(env, "OMPI_COMM_WORLD_RANK")) {
    out.launcher = "openmpi";
    out.rank = int_or(env, "OMPI_COMM_WORLD_RANK", 0, 0);
    out.world_size = int_or(env, "OMPI_COMM_WORLD_SIZE", 1, 1);
    out.local_rank = int_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 0);
    out.local_world_size = int_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", out.world_size, 1);
  } else if (lookup(env, "SLURM_PROCID")) {
    out.launcher = "slurm";
    out.rank = int_or(env, "SLURM_PROCID", 0, 0);
    out.world_size = int_or(env, "SLURM_NTASKS", 1, 1);
    out.local_rank = int_or(env, "SLURM_LOCALID", 0, 0);
    out.local_world_size = slurm_tasks_per_node(env, out.world_size);
  } else {
    out.launcher = "single";
  }
  MMSP_CHECK(out.rank < out.world_size, "rank ", out.rank, " is not below the world size ", out.world_size,
             " (launcher: ", out.launcher, ")");
  MMSP_CHECK(out.local_rank < out.local_world_size, "local rank ", out.local_rank,
             " is not below the local world size ", out.local_world_size);
  MMSP_CHECK(out.world_size == 1 || out.launcher == "torchrun" || lookup(env, "MASTER_ADDR"),
             "MASTER_ADDR must name rank 0's host when ranks are started by ", out.launcher,
             " (e.g. export MASTER_ADDR=$(hostname) on the first node)");
  if (auto addr = lookup(env, "MASTER_ADDR")) out.master_addr = *addr;
  out.master_port = int_or(env, "MASTER_PORT", out.master_port, 1);
  MMSP_CHECK(out.master_port <= 65535, "MASTER_PORT=", out.master_port, " is not a TCP port");
  if (auto nic = lookup(env, "GLOO_SOCKET_IFNAME")) out.gloo_interface = *nic;
  if (auto id = lookup(env, "MMSP_RUN_ID")) out.run_id = *id;
  return out;
}

Environment process_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string kv(*entry);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

}  // namespace mmsp::dist
