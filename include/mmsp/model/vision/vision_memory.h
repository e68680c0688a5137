// What a vision tower keeps in memory per token it encodes, as its family builds it: the
// preflight (train/memory/memory_estimate.h) multiplies it by the tokens each rank's
// tower encodes in a step (plan/vision_assignment.h, vision_split.h), so that a step
// with a long video is refused before it allocates, not killed by the allocator.
// Elements, not bytes: the estimate prices them in the compute dtype. Each family's
// numbers are checked against the memory counter on its own tower
// (tests/model/test_vision_memory.cpp).
#pragma once

#include <cstdint>

namespace mmsp::model {

struct VisionMemoryShape {
  int64_t blocks = 0;  // encoder blocks: hook units, recomputed under --checkpoint-activations all
  int64_t width = 0;   // D: a block's input per token (what a recomputed block keeps)
  // Per token and block, kept for the backward: norms' inputs and outputs, q/k/v and
  // their rotated copies, the attention's output, the MLP's intermediates.
  int64_t kept_per_block = 0;
  // Per token, the largest transient of one block's backward (the MLP intermediate's
  // gradients beside the intermediates themselves).
  int64_t block_transient = 0;
  // Per token, kept outside the blocks: the pixels' embedding, position tables, the
  // merger or projector's activations.
  int64_t kept_outside = 0;
  // Elements of one token's pixels as the tower reads them (Qwen: C·tp·p·p).
  int64_t pixels_per_token = 0;
  // Elements of one embedding row the tower hands the decoder (its hidden size, times
  // 1 + the deepstack levels): kept as the encoder's output and where it is routed.
  int64_t row_width = 0;
};

}  // namespace mmsp::model
