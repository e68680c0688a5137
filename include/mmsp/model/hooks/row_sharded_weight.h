// A [V, h] table (the LM head, the token embedding) that ZeRO-3 never gathers whole:
// rank r keeps rows [r·R, (r+1)·R) of it, R = ceil(V / P), and a step reads it by
// rounds of rows (the chunked loss: round k brings rows [r·R + k·B, r·R + (k+1)·B) of
// every rank r, so each round is one all-gather of equal pieces, the next one in flight
// while this one computes) or by the rows its tokens look up (the embedding). The
// gradient of a round's rows goes back to their owners at once (one reduce-scatter of
// equal pieces), so neither the weight nor its gradient is ever whole: a 152k × 3,584
// head (1.1 GB in bf16) is held as 2-3 rounds of rows. Every call is collective: every
// rank calls the same rounds in the same order (ranks with no tokens look up none).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace mmsp::model {

class RowShardedWeight {
 public:
  virtual ~RowShardedWeight() = default;
  virtual int64_t vocab() const = 0;          // V
  virtual int64_t width() const = 0;          // h
  virtual int64_t ranks() const = 0;          // P
  virtual int64_t rows_per_rank() const = 0;  // R = ceil(V / P)
  // Rounds of `block` rows a rank: ceil(R / block).
  int64_t rounds(int64_t block) const { return (rows_per_rank() + block - 1) / block; }

  // Round k of `block` rows per rank, [P·block, h] in the model's dtype: row r·block + j
  // is table row r·R + k·block + j (zeros where that is past the rank's R rows or the
  // table's V: the caller masks them). Issues round k + 1's gather before returning.
  virtual at::Tensor gather_round(int64_t k, int64_t block) = 0;
  // The gradient of round k's rows, [P·block, h] (any floating dtype): summed over the
  // ranks into the owners' shards of the table's gradient.
  virtual void reduce_round(int64_t k, int64_t block, const at::Tensor& grad) = 0;
  // table[ids] for this rank's ids (any shape, values in [0, V)): [..., h].
  virtual at::Tensor lookup(const at::Tensor& ids) = 0;
};

}  // namespace mmsp::model
