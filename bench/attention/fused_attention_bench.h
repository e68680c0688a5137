// `mmsp bench attention --part fused [--device cuda]`: mmsp's local attention (the kernel
// `auto` picks: FlashAttention-2 varlen on CUDA) forward + backward against the best of
// torch's SDPA backends on the same causal shapes, and on packed segments against the
// same backends on the padded batch. On the CPU it runs the same code on small shapes
// (a dry run of the GPU benchmark; its ratios say nothing about GPUs).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "mmsp/dist/rank_device.h"
#include "mmsp/dist/rank_env.h"

namespace mmsp::bench {

struct FusedAttentionBenchOptions {
  std::vector<int64_t> tokens{8192, 32768};  // one causal sequence each
  int64_t heads = 16, kv_heads = 16, dim = 128;
  std::string dtype = "bfloat16";  // bfloat16 | float16 | float32 | float64
  // packed rows: segment lengths (cycled) filling the longest --tokens
  std::vector<int64_t> segments{512, 1024, 2048, 4096, 256};
  int repeats = 5;              // timed runs after 2 warm-ups; the median is kept
  std::string kernel = "auto";  // mmsp's --attention-kernel
  c10::Device device{c10::kCPU};
};

nlohmann::json bench_fused_attention(const FusedAttentionBenchOptions& options);

// --dtype's value as a type; anything else is an error naming it.
at::ScalarType bench_dtype(const std::string& name);

// Every rank of the job (mmsp-run -n R; on one GPU with MMSP_SHARE_GPU=1): the zigzag ring
// over the job's ranks on one causal sequence of the longest --fused-tokens, forward +
// backward, with the communication overlapped and not (AttentionOptions::overlap): the
// seconds, the exposed communication (the phase timer's time waiting in the exchanges) and
// the communication the overlap hid (off − on); against one rank's local kernel on the whole
// sequence, whose time ÷ R is the ring's ideal (rank 0's result).
// `collectives`: how the ring's CUDA tensors travel (rank_device.h).
nlohmann::json bench_ring_attention(const dist::RankEnv& env, const FusedAttentionBenchOptions& options,
                                    dist::GpuCollectives collectives);

}  // namespace mmsp::bench
