// ZeRO-3's LM head and token embedding by rows (model/hooks/row_sharded_weight.h): a [V, h]
// table alone in its bucket, sharded row-aligned (rank r's shard of the masters is rows
// [r·R, (r+1)·R), R = ceil(V / P), zero-padded past V), read by rounds of rows gathered
// from every rank's shard and by the rows a rank's tokens look up, its rounds' gradients
// reduce-scattered straight into the owners' shards of the reduced gradient. Built and
// owned by ShardedModel (sharded_model.h); the masters and gradient are its tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "mmsp/dist/group.h"
#include "mmsp/dist/shard_collectives.h"
#include "mmsp/model/hooks/row_sharded_weight.h"

namespace mmsp::parallel {

class RowShardedTable : public model::RowShardedWeight {
 public:
  // `master`: this rank's [R·h] rows of the masters (updated in place by the optimizer);
  // `grad`: this rank's [R·h] of the table's reduced gradient, made on first use;
  // `model_dtype`: what the model computes in (rounds and lookups come in it).
  RowShardedTable(int64_t vocab, int64_t width, at::Tensor master, std::function<at::Tensor()> grad,
                  at::ScalarType model_dtype, dist::GroupPtr world);

  int64_t vocab() const override { return vocab_; }
  int64_t width() const override { return width_; }
  int64_t ranks() const override { return world_->size(); }
  int64_t rows_per_rank() const override { return rows_per_rank_; }
  at::Tensor gather_round(int64_t k, int64_t block) override;
  void reduce_round(int64_t k, int64_t block, const at::Tensor& grad) override;
  at::Tensor lookup(const at::Tensor& ids) override;

  // Rows per rank for a table of `vocab` rows over `ranks` (the row-aligned shard is
  // this times the width).
  static int64_t rows_per_rank(int64_t vocab, int ranks) { return (vocab + ranks - 1) / ranks; }

 private:
  at::Tensor my_round(int64_t k, int64_t block) const;  // [block·h] of this rank's rows, model dtype
  void start(int64_t k, int64_t block);

  int64_t vocab_, width_, rows_per_rank_;
  at::Tensor master_;
  std::function<at::Tensor()> grad_;
  at::ScalarType model_dtype_;
  dist::GroupPtr world_;
  // The next round's gather in flight: (round, block) and its buffer.
  int64_t pending_round_ = -1, pending_block_ = 0;
  at::Tensor incoming_;
  dist::PendingGather pending_;
};

}  // namespace mmsp::parallel
