// AdamW over ZeRO's shards (`--shard optimizer|gradients|parameters`): the two moments
// of this rank's shard of every bucket, and the update of the masters there with
// torch::optim::AdamW's arithmetic (decoupled decay on matrices only, as make_adamw's
// groups). Everything else, the shards and their gradients, the hooks, the
// reduce-scatter, the lookup rows and the weights' gathers, is the model's sharding
// (parallel/zero/sharded_model.h), which this optimizer only steps.
// Memory per rank, for N parameters and masters of m bytes: 2·m·N/P for the moments
// (+ padding, < P per bucket), beside the masters' m·N/P.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mmsp/model/named_params.h"
#include "mmsp/parallel/zero/sharded_model.h"
#include "mmsp/train/optim/optimizer.h"

namespace mmsp::train {

// The three tensors a checkpoint keeps per piece.
enum class ShardTensor { master, exp_avg, exp_avg_sq };

class ShardedAdamW {
 public:
  // Elements per slice of the update's arithmetic: its temporaries (the square root
  // and the denominator) stay 4 MiB in fp32, which the block cache reuses, not a
  // shard's size each (a quarter of Qwen3.5-0.8B's embedding is 243 MiB in fp32).
  static constexpr int64_t kUpdateSlice = int64_t{1} << 20;

  // Moments of zeros beside each of `sharded`'s master shards. `whole_offsets` (empty, or
  // one per model parameter): where the rank's tensor starts in the whole parameter a
  // checkpoint holds (expert parallelism: a rank's rows of a fused expert tensor); 0 else.
  ShardedAdamW(std::shared_ptr<parallel::ShardedModel> sharded, const AdamWOptions& options,
               std::vector<int64_t> whole_offsets = {});

  void set_lr(double lr);
  // The model's gradients and the reduced shards are released.
  void zero_grad() { sharded_->zero_grad(); }
  // After the backward: the gradients reduced and their global norm
  // (parallel::ShardedModel), clipped to max_norm as clip_grad_norm does (≤ 0 only
  // measures), AdamW on the shards, the model's weights refreshed. Returns the norm
  // before clipping; a non-finite one is an error on every rank and updates nothing.
  double step(double max_norm);
  // step() in halves, for several optimizers under one norm (step_together): the
  // gradients reduced (this rank's shards), then AdamW on them times `scale` (the clip).
  std::vector<at::Tensor> reduce_gradients() { return sharded_->reduce_gradients(); }
  void update(std::vector<at::Tensor>& grads, double scale);

  parallel::ShardedModel& sharded() const { return *sharded_; }
  const model::NamedParams& model_params() const { return sharded_->model_params(); }
  const std::vector<parallel::ShardPiece>& pieces() const { return sharded_->pieces(); }
  int64_t steps_taken() const { return steps_; }
  const AdamWOptions& options() const { return options_; }
  // The piece's elements of one tensor (a view of this rank's state).
  at::Tensor piece(const parallel::ShardPiece& piece, ShardTensor which) const;
  // The piece's first element in the whole parameter a checkpoint holds.
  int64_t whole_offset(const parallel::ShardPiece& piece) const {
    return piece.param_offset + (whole_offsets_.empty() ? 0 : whole_offsets_.at(piece.param));
  }

  // Puts a checkpoint's state into this rank's shards: `read(name, which, offset,
  // length)` returns those elements of the named parameter's tensor (the masters: the
  // exact training weights; offsets in the whole parameter: whole_offset). Then the model
  // gets every weight by an all-gather.
  using StateReader =
      std::function<at::Tensor(const std::string& name, ShardTensor which, int64_t offset, int64_t length)>;
  void load(int64_t steps_taken, const StateReader& read);

  // Bytes of the sharded state this rank holds: masters and both moments, padding
  // included.
  int64_t state_bytes() const;

 private:
  struct Moments {
    at::Tensor exp_avg, exp_avg_sq;  // [shard], master dtype
  };
  std::shared_ptr<parallel::ShardedModel> sharded_;
  AdamWOptions options_;
  std::vector<Moments> moments_;  // by bucket
  std::vector<int64_t> whole_offsets_;
  int64_t steps_ = 0;
};

// One step of several sharded optimizers of one model (expert parallelism: the dense
// weights' over the world, the experts' over the ranks holding the same experts): their
// gradients reduced, one norm over `world` (parallel::grad_norm) clipped for all as
// clip_grad_norm clips the whole model, AdamW on each. Returns the norm before clipping.
double step_together(const std::vector<ShardedAdamW*>& optimizers, double max_norm, dist::Group& world);

}  // namespace mmsp::train
