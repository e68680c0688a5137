// What attention needs to know about each token: its packed segment and its order
// within the unsharded segment (not its rotary position: mRoPE positions repeat
// inside an image). The plan provides these; attention never looks at token ids.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace mmsp::attention {

// segment: int64 [T], the packed segment of each token; < 0 marks padding, which
// no query attends to. order: int64 [T], index within the unsharded segment.
// Query i attends key j iff segment_i == segment_j >= 0 and (not causal, or
// order_j <= order_i). Both are plan metadata on the CPU.
struct TokenLayout {
  at::Tensor segment;
  at::Tensor order;

  int64_t size() const { return segment.defined() ? segment.size(0) : 0; }
  // Checks dtype, shapes and device; `what` names the caller in the message.
  void check(const char* what) const;
  // Tokens [begin, begin + length).
  TokenLayout slice(int64_t begin, int64_t length) const;
  // The layouts joined in order (e.g. a ring rank's share from its ulysses slices).
  static TokenLayout concat(const std::vector<TokenLayout>& parts);
};

// A range of key tokens that a range of query tokens attends to, found from the
// layouts alone: full (every pair allowed: no mask needed) or partial.
struct KeyBlock {
  int64_t begin = 0, end = 0;
  bool full = false;
};

// For each block of block_q queries, the blocks of block_k keys with at least one
// allowed pair; blocks the mask empties are skipped (zigzag and packing leave many).
struct BlockSchedule {
  int64_t block_q = 0, block_k = 0;
  std::vector<std::vector<KeyBlock>> key_blocks;  // [query block] -> non-empty key blocks

  static BlockSchedule make(const TokenLayout& q, const TokenLayout& k, bool causal, int64_t block_q, int64_t block_k);
};

// Number of allowed (query, key) pairs: the attention work of a layout pair.
int64_t allowed_pairs(const TokenLayout& q, const TokenLayout& k, bool causal);

}  // namespace mmsp::attention
