// The decoder's local attention kernel for a run: the one --attention-kernel pins, or —
// auto on CUDA — the kernel measured fastest on this GPU among those that pass the
// exactness probe against the blockwise kernel (attention/kernel_choice.h), for the
// decoder's shape on this mesh (dtype, head size, heads and K/V heads per Ulysses rank,
// a ring share's tokens), chosen once before the first step with every rank agreeing and
// its table logged by rank 0. On the CPU auto stays the rule (the blockwise kernel): a
// measured choice there would move every CPU run's numbers, and the golden losses, with
// the machine's timings. Private to train/.
#pragma once

#include <ostream>

#include "mmsp/attention/kernel_registry.h"
#include "mmsp/dist/mesh.h"
#include "run_inputs.h"

namespace mmsp::train {

attention::AttentionKernel decoder_attention_kernel(const TrainOptions& o, const RunInputs& in, const dist::Mesh& mesh,
                                                    std::ostream& log);

}  // namespace mmsp::train
