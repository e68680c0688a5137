// Vision-tower SP's attention over the split items: the exchange gathers every context
// rank's tokens rank by rank (each rank's shards in item order), while one process
// attends item by item (Qwen2.5-VL: window by window). A GatheredOrder is that
// permutation, built once per step from the plan, and the segments in the attended
// order; every block's attention goes through it. Shared by the towers that exchange.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "mmsp/attention/token_layout.h"

namespace mmsp::model {

struct GatheredOrder {
  at::Tensor perm, inverse;       // gathered index of each attended token, and back; undefined: the same
  attention::TokenLayout layout;  // segment and order of each token, in the attended order

  // perm[i]: the gathered index of the i-th token in the attended order; segment[i],
  // order[i]: its segment (a frame, window or image: tokens attend within it) and place.
  static GatheredOrder make(const std::vector<int64_t>& perm, const std::vector<int64_t>& segment,
                            const std::vector<int64_t>& order);

  // Bidirectional attention over the gathered q, k, v [T, h, d] in the attended order; the
  // output [T, h, d] in the gathered order.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
};

}  // namespace mmsp::model
