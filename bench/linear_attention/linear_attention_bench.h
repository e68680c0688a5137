// `mmsp bench linear-attention`: the chunked gated delta rule's throughput against
// the token-by-token recurrence (one process), and the bytes per Gated DeltaNet
// layer that Ulysses and ring state passing send, measured by the byte counters
// beside their formulas, over sequence lengths (real ranks).
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "mmsp/dist/rank_env.h"

namespace mmsp::bench {

struct LinearAttentionBenchOptions {
  std::vector<int64_t> tokens{4096, 8192, 16384, 32768, 65536};  // comm: context-group tokens
  int64_t kernel_tokens = 4096;                                  // kernel: sequence length
  int64_t hidden = 64;
  int64_t key_heads = 4;
  int64_t value_heads = 8;
  int64_t key_dim = 32;
  int64_t value_dim = 32;
  int threads = 1;                // ATen intra-op threads
  c10::Device device{c10::kCPU};  // kernel part: where the tensors live (cli: --device)
};

// One process: chunked kernel vs recurrence, fp32 and fp64, forward.
nlohmann::json bench_linear_attention_kernel(const LinearAttentionBenchOptions& options);

// Every rank of the job calls this (2 or 4 ranks); rank 0's result holds every
// scheme and length: measured and formula bytes, forward and backward, and the
// formula for Qwen3-Next's own sizes beside them.
nlohmann::json bench_linear_attention_comm(const dist::RankEnv& env, const LinearAttentionBenchOptions& options);

}  // namespace mmsp::bench
