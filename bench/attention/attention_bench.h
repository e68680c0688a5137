// `mmsp bench attention`: the local kernel's throughput against torch::mm and the
// naive full-matrix attention (Google Benchmark, one process), the causal-work
// balance of zigzag vs contiguous shards (pure arithmetic), and per-scheme bytes
// per layer measured by the byte counters beside the docs/runtime.md formulas (real ranks).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "mmsp/dist/rank_env.h"

namespace mmsp::bench {

struct AttentionBenchOptions {
  int64_t tokens = 4096;  // sequence length of the kernel benchmark
  int64_t heads = 8;
  int64_t kv_heads = 8;
  int64_t dim = 128;
  int64_t block_q = 512;  // kernel blocks (AttentionOptions)
  int64_t block_k = 512;
  int threads = 1;             // ATen intra-op threads (same for mm and attention)
  double min_time = 0.5;       // seconds per Google Benchmark measurement
  int64_t comm_tokens = 8192;  // tokens of the context group in the comm benchmark
};

// Single process: kernel vs mm vs naive, and the balance table.
nlohmann::json bench_attention_kernel(const AttentionBenchOptions& options);
nlohmann::json bench_attention_balance(const AttentionBenchOptions& options);

// Every rank of the job calls this; rank 0's result holds every scheme of the world.
nlohmann::json bench_attention_comm(const dist::RankEnv& env, const AttentionBenchOptions& options);

}  // namespace mmsp::bench
