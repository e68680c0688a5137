// `--shard optimizer` (ZeRO stage 1): the AdamW state and the master weights split
// over every rank of the world instead of held whole by each.
//
// Layout: the gradient buckets of GradSync (same order, dtype groups and sizes on every
// rank), each padded with zeros to a multiple of the world size P and cut into P equal
// shards; rank r owns elements [r·S, (r+1)·S) of every bucket. Per step:
//   1. pack the model's gradients into a bucket (converted to the master dtype) and
//      release them; reduce-scatter the bucket: rank r gets the world sum of its shard;
//   2. the global gradient norm from each rank's Σ g² of its shards (one fp64
//      all-reduce), clipping as clip_grad_norm does;
//   3. AdamW on the shards, with torch::optim::AdamW's arithmetic (decoupled decay on
//      matrices only, as make_adamw's groups);
//   4. all-gather the updated shards, rounded to the model's dtype, into the model.
// Memory per rank, for N parameters with model dtype of b bytes and masters of m bytes:
// model N·b, grads N·b until packed, masters + 2 moments 3·m·N/P (+ padding, < P per
// bucket). Bytes sent per step: (P−1)/P · N·m (reduce-scatter) + (P−1)/P · N·b
// (all-gather), against 2 (P−1)/P · N·m for the replicated all-reduce.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mmsp/dist/group.h"
#include "mmsp/train/grad_sync.h"
#include "mmsp/train/named_params.h"
#include "mmsp/train/optimizer.h"

namespace mmsp::train {

// What `--shard` splits over the world. (ZeRO 2 and 3, gradients and parameters, are
// not implemented: see docs/train.md.)
enum class ShardLevel { none, optimizer };
ShardLevel parse_shard_level(const std::string& name);  // "none" | "optimizer"
const char* to_string(ShardLevel level);

// The part of one parameter inside this rank's shard of its bucket (at most one per
// parameter: a bucket holds its parameters contiguously).
struct ShardPiece {
  size_t param = 0;          // index into the model's parameters
  int64_t param_offset = 0;  // first element, in the flattened parameter
  int64_t length = 0;
  size_t bucket = 0;
  int64_t shard_offset = 0;  // first element within this rank's shard of the bucket
};

// The three tensors a checkpoint keeps per piece.
enum class ShardTensor { master, exp_avg, exp_avg_sq };

class ShardedAdamW {
 public:
  // `model_params`: the model's parameters (names unique, tensors distinct). The
  // masters start as this rank's shards of them, converted to master_dtype.
  ShardedAdamW(NamedParams model_params, at::ScalarType master_dtype, const AdamWOptions& options,
               dist::GroupPtr world, int64_t bucket_bytes = kDefaultBucketBytes);

  void set_lr(double lr);
  // The masters become this rank's shards of the model's weights again (after the
  // model was loaded from a file).
  void copy_from_model();
  // The model's gradients are released (undefined); a parameter without a gradient
  // counts as zeros.
  void zero_grad();
  // Steps 1–4 above after the backward; returns the gradient norm before clipping
  // (max_norm ≤ 0 only measures). A non-finite norm is an mmsp::Error on every rank
  // naming the first parameter of this rank's shards with a non-finite gradient;
  // nothing is updated then.
  double step(double max_norm);

  const NamedParams& model_params() const { return model_; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  int64_t steps_taken() const { return steps_; }
  const AdamWOptions& options() const { return options_; }
  // The piece's elements of one tensor (a view of this rank's state).
  at::Tensor piece(const ShardPiece& piece, ShardTensor which) const;

  // Puts a checkpoint's state into this rank's shards: `read(name, which, offset,
  // length)` returns those elements of the named parameter's tensor (the masters: the
  // exact training weights). Then the model gets every weight by an all-gather.
  using StateReader =
      std::function<at::Tensor(const std::string& name, ShardTensor which, int64_t offset, int64_t length)>;
  void load(int64_t steps_taken, const StateReader& read);

  // Bytes of the sharded state this rank holds (masters and both moments, padding
  // included), and what one step sends (reduce-scatter + all-gather).
  int64_t state_bytes() const;
  int64_t step_bytes() const;

 private:
  struct Shard {
    GradBucket bucket;      // in the model's dtype
    int64_t shard = 0;      // elements per rank: padded numel / P
    at::Tensor master, exp_avg, exp_avg_sq;  // [shard], master dtype
    at::Tensor decays;      // [shard] bool: the element's parameter is a matrix
  };
  at::Tensor pack_grads(const Shard& s);
  void gather_into_model(const Shard& s);
  double global_norm(const std::vector<at::Tensor>& grads) const;

  NamedParams model_;
  AdamWOptions options_;
  dist::GroupPtr world_;
  at::ScalarType master_dtype_;
  std::vector<Shard> shards_;
  std::vector<ShardPiece> pieces_;
  int64_t steps_ = 0;
};

}  // namespace mmsp::train
