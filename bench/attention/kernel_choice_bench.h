// `mmsp bench attention --part choice [--device cuda]`: the measured choice of
// `--attention-kernel auto` (attention/kernel_choice.h) for each --fused-tokens length:
// every registry kernel probed against the blockwise kernel on the device and timed, the
// table and the kernel that wins. On the CPU the same code (cuDNN skipped with its reason,
// the fused kernel on ATen's CPU flash kernel): the dry run of the GPU's table.
#pragma once

#include <nlohmann/json.hpp>

#include "fused_attention_bench.h"

namespace mmsp::bench {

nlohmann::json bench_kernel_choice(const FusedAttentionBenchOptions& options);

}  // namespace mmsp::bench
