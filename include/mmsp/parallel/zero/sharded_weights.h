// The model's weights under `--shard`: each gradient bucket's weights are rebuilt in the
// model from every rank's shard of the masters (an all-gather), and under
// `--shard parameters` (ZeRO-3) freed between uses. This class is that gather, prefetch
// and free, by bucket and by hooked unit (model/hooks/layer_hooks.h); the sharded model
// (sharded_model.h) owns the masters and says when the optimizer changed them.
//
// Stage 3 frees a weight's memory in place and refills it before its next use (FSDP's
// storage().resize_(0)): the tensor, and every view autograd saved of it, keep pointing at
// the same storage, so each parameter must be its storage's only tenant (checked).
// A unit's gather is issued early by its neighbour (prefetch) and lands in a buffer the
// model reads only once it is waited for. Stages 1 and 2 keep every weight; there a
// gather only refreshes the model after the update.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mmsp/dist/group.h"
#include "mmsp/dist/shard_collectives.h"
#include "mmsp/model/named_params.h"
#include "mmsp/parallel/grad_sync.h"

namespace mmsp::parallel {

class ShardedWeights {
 public:
  // `frees`: stage 3 (weights freed between uses). A gather or reduction round moves at
  // most round_bytes per rank.
  ShardedWeights(model::NamedParams model, dist::GroupPtr world, bool frees, int64_t round_bytes);

  // Bucket b (the next index): its parameters, elements per rank, and this rank's [shard]
  // of the masters, which the optimizer updates in place. Stage 3: the bucket's weights
  // are freed now. `unit`: its hooked unit (−1: none); `prefetched`: a neighbour issues
  // the unit's gather early (model::HookUnit::prefetched); `by_rows`: the unit is read
  // by rows (row_sharded_table.h), so its uses gather nothing whole (gather_all still does).
  void add_bucket(const GradBucket& bucket, int64_t shard, at::Tensor master, bool prefetched, bool by_rows = false);

  // Stage 3: the unit's weights into the model (waiting for a prefetch), and freed again.
  void gather_unit(int unit);
  void release_unit(int unit);
  // Stage 3: issues the unit's gathers without waiting (no-op for a unit out of range, not
  // prefetched, or already gathered); gather_unit finishes them.
  void prefetch_unit(int unit);
  // Stage 3, every rank, before the forward: the weights outside the units (vision
  // tower's patch embedding, norms, projector) into the model, for the whole step.
  void gather_outside_units();
  // Every weight into the model (all-gathered where freed), and back to stage 3's state.
  void gather_all();
  void release_all();
  // The masters of bucket b changed: stages 1 and 2 gather the bucket now; stage 3 frees
  // it and gathers it before its next use. A prefetch not consumed is dropped.
  void refresh(size_t b);

  bool frees() const { return frees_; }
  // Elements of `dtype` a rank contributes per round so that a round's P rows hold at most
  // round_bytes (at least 1).
  int64_t elements_per_round(at::ScalarType dtype) const;

 private:
  struct Bucket {
    GradBucket layout;
    int64_t shard = 0;
    at::Tensor master;  // [shard], the sharded model's
    bool prefetched = true;
    bool by_rows = false;  // stage 3: read by rows, never gathered for a unit's use
    bool gathered = true;  // its weights are in the model now
    at::Tensor incoming;   // [P·S]: a prefetched gather's buffer while it is in flight
    dist::PendingGather prefetch;
  };
  const std::vector<size_t>& unit_buckets(int unit) const;  // empty for a unit without buckets
  void gather(Bucket& b);
  void gather_in_rounds(Bucket& b);
  void start_gather(Bucket& b);
  void release(Bucket& b);

  model::NamedParams model_;  // the same tensors as the sharded model's
  dist::GroupPtr world_;
  bool frees_;
  int64_t round_bytes_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> unit_buckets_;  // hooked unit → its buckets
};

}  // namespace mmsp::parallel
