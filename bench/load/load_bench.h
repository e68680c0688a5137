// `mmsp bench load`: writes a sharded Hugging Face directory of bf16 tensors, then every
// rank of the job opens and loads it into fp32 and into bf16 parameters, each timed
// against `cat` of the same files run just before (so both read from the page cache),
// with the peak tensor memory of the load against the bytes the rank keeps.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "mmsp/dist/rank_env.h"

namespace mmsp::bench {

struct LoadBenchOptions {
  uint64_t bytes = 1'000'000'000;  // tensor data to write (bf16), about
  int shards = 4;                  // shard files (max_shard_bytes = bytes / shards, hub's plan)
  std::string dir;                 // where to write; empty: a fresh directory under /tmp
};

// Every rank calls it; rank 0's result holds every rank's figures.
nlohmann::json bench_load(const dist::RankEnv& env, const LoadBenchOptions& options);

}  // namespace mmsp::bench
