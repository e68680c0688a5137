// `--shard optimizer|gradients|parameters` (ZeRO stages 1, 2, 3): the model's parameters
// spread over every rank of the world. Each rank holds its shard of the master weights
// (1), of the reduced gradients (2) and, between uses, of the model's weights (3); the
// optimizer (train/optim/sharded_adamw.h: the AdamW moments and the update) steps these
// shards and nothing else. parallel/parallelize.h installs this on a model.
//
// Layout: the gradient buckets of GradSync (same order, dtype groups and sizes on every
// rank; with stages 2 and 3 a bucket never spans two hooked units: the decoder layers,
// the LM head, the untied token embedding, the vision blocks, model/hooks/layer_hooks.h),
// each padded with zeros
// to a multiple of the world size P and cut into P equal shards; rank r owns elements
// [r·S, (r+1)·S) of every bucket. Per step:
//   1. pack the model's gradients into a bucket (converted to the master dtype) and
//      release them; reduce-scatter the bucket: rank r gets the world sum of its shard.
//      Stage 1 does this after the backward; stages 2 and 3 do it for a unit's buckets
//      as soon as its backward is done (zero_hooks.h), so at most one layer's
//      gradients are whole at a time; the rest (norms, patch embedding, mergers,
//      projectors) after the backward. The token lookup's gradient (of the untied embedding, or of the head
//      tied to it) never becomes a dense [V, h] tensor there: the lookup hands over its
//      T·h gradient rows (model::hooked_lookup), and after the backward every rank
//      all-gathers every rank's token ids and rows and adds those that fall in its
//      shards (a tied head's dense part was reduced at its own after_backward, an
//      untied embedding has none: no reduce-scatter of its V·h elements);
//   2. the global gradient norm from each rank's Σ g² of its shards (one fp64
//      all-reduce), for the optimizer's clipping;
//   3. (the optimizer) AdamW on the shards of the masters;
//   4. (refresh; ShardedWeights, sharded_weights.h) all-gather the updated shards, rounded to
//      the model's dtype, into the model, in
//      rounds of at most 2·bucket_bytes written straight into the weights (Gloo's
//      all-gather copies its whole output into a flat buffer of its own first: a lone
//      embedding gathered whole was held twice besides the model).
//      Stage 3 instead frees every weight after the step: the weights outside the
//      units (norms, patch embedding, mergers, projector) are all-gathered before the
//      forward (gather_step_weights) and kept for the step; each unit is all-gathered
//      just before each use and freed after it: a decoder layer or vision block before
//      its forward and again before its backward, the head before the loss and again
//      before its backward, the embedding before its lookup (a tied one is the head's
//      unit: three gathers). The next unit's gather (forward: unit i+1, backward: unit
//      i−1) is issued as a unit begins, without waiting, so it moves while the unit
//      computes (FSDP's prefetch); it lands in a buffer the model reads only once the
//      gather is waited for. The last layer prefetches the head and the head's backward
//      the last layer; the embedding, used first, and vision block 0, whose neighbours
//      in unit order are not its neighbours in time, are not prefetched, nor do they
//      prefetch (ShardUnitUse::prefetched). A rank without images runs the vision
//      blocks on no rows, so every rank gathers them alike. A unit the step never reads
//      (LLaVA's CLIP layers above vision_feature_layer) is never gathered, and its
//      gradient is zero without a reduce-scatter.
// Frozen parameters (--freeze, LoRA's base) have no master, gradient or optimizer state.
// Under stage 3 those of the layers and vision blocks are sharded too, in the model's
// dtype (ZeRO-3 as DeepSpeed and FSDP do it for a frozen base): their own buckets, by unit,
// gathered and freed with the unit's trained ones, never reduced. The frozen parameters
// outside the units and a frozen head or embedding stay whole on every rank.
// Under stage 3 the LM head and the token embedding (HookUnit::vocab_rows, alone in
// their buckets) are never gathered whole: their shards are row-aligned, the loss reads
// the head by rounds of rows and reduce-scatters each round's gradient at once, the
// lookup asks the owners for its tokens' rows (row_sharded_table.h); a tied head's lookup
// gradient still comes as rows, added by reduce_gradients().
// Memory per rank, for N parameters (N_r outside the units, N_l the largest layer or
// vision block, N_h the head, N_e an untied embedding), model dtype of b bytes and
// masters of m bytes:
// masters m·N/P (+ padding, < P per bucket; the optimizer's 2 moments as much again); model N·b (stage 3: none
// between steps, and during one N_r·b plus at most 2·max(N_l, N_h, N_e)·b: a unit in
// use and the next one's gather in flight, or a unit and the buffer it is gathered
// into); grads N·b until packed (stages 2 and 3: at most (N_r + max(N_l, N_h))·b, and
// the lookup's T·h·b rows; after the backward every rank's rows, T_world·h·b).
// Bytes sent per step: (P−1)/P · N'·m (reduce-scatter; N' = N, less an untied embedding
// at stages 2, 3) + (P−1)/P · Σ_units g_u·N_u·b (all-gathers; g_u = 1 below stage 3, the
// unit's gathers at stage 3), against 2 (P−1)/P · N·m for the replicated all-reduce;
// stages 2, 3 add (P−1)·(8 + n·(8 + h·b)) for the lookup's rows, n the most tokens a
// rank looked up (lookup_row_bytes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "mmsp/dist/group.h"
#include "mmsp/model/hooks/layer_hooks.h"
#include "mmsp/model/named_params.h"
#include "mmsp/parallel/grad_sync.h"
#include "mmsp/parallel/zero/row_sharded_table.h"
#include "mmsp/parallel/zero/shard_level.h"
#include "mmsp/parallel/zero/shard_unit_use.h"
#include "mmsp/parallel/zero/sharded_weights.h"

namespace mmsp::parallel {

// The part of one parameter inside this rank's shard of its bucket (at most one per
// parameter: a bucket holds its parameters contiguously).
struct ShardPiece {
  size_t param = 0;          // index into the model's parameters
  int64_t param_offset = 0;  // first element, in the flattened parameter
  int64_t length = 0;
  size_t bucket = 0;
  int64_t shard_offset = 0;  // first element within this rank's shard of the bucket
};

class ShardedModel {
 public:
  // `model_params`: the model's parameters (names unique, tensors distinct). The
  // masters start as this rank's shards of them, converted to master_dtype.
  // A bucket's reduce-scatter packs at most 2·bucket_bytes per round (a bucket of bf16
  // gradients in fp32: one round; a larger parameter, alone in its bucket: several).
  // `level` ≥ optimizer. For gradients and parameters, `unit_of` gives each parameter's
  // hooked unit (−1: none): what the hooks (zero_hooks.h) reduce, gather and free by
  // unit, and `uses` how a step uses each unit (missing: as a decoder layer). With
  // parameters, the model's memory is freed here (each parameter must own its storage);
  // every rank must then run the same units each step.
  // `frozen` (stage 3 only; each of a unit read whole, `frozen_unit_of` its unit): the
  // frozen parameters sharded as above; their memory is freed here too.
  ShardedModel(model::NamedParams model_params, at::ScalarType master_dtype, dist::GroupPtr world,
               int64_t bucket_bytes = kDefaultBucketBytes, ShardLevel level = ShardLevel::optimizer,
               std::vector<int> unit_of = {}, std::vector<ShardUnitUse> uses = {}, model::NamedParams frozen = {},
               const std::vector<int>& frozen_unit_of = {});

  ShardLevel level() const { return level_; }
  const model::NamedParams& model_params() const { return model_; }
  at::ScalarType master_dtype() const { return master_dtype_; }
  const dist::GroupPtr& world() const { return world_; }

  // This rank's shards, one per bucket: [shard_elements(b)] of the masters, which the
  // optimizer updates in place (then refresh(b)), and the pieces of parameters in them.
  size_t bucket_count() const { return shards_.size(); }
  int64_t shard_elements(size_t b) const { return shards_.at(b).shard; }
  const at::Tensor& master(size_t b) const { return shards_.at(b).master; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  // The piece's elements of the masters (a view of this rank's shard).
  at::Tensor master_piece(const ShardPiece& piece) const;

  // The masters and the frozen shards become this rank's shards of the model's weights
  // again (after the model was loaded from a file; stage 3: gathered first).
  void copy_from_model();
  // The frozen shards alone (a resume: the masters come from the checkpoint).
  void copy_frozen_from_model();
  // The frozen parameters sharded here (stage 3).
  const model::NamedParams& sharded_frozen() const { return frozen_; }
  // The model's gradients are released (undefined), and the reduced shards; a
  // parameter without a gradient counts as zeros.
  void zero_grad();
  // Stage 3, every rank, before the forward: the weights outside the units (vision
  // tower, norms, projector) into the model, for the whole step.
  void gather_step_weights();
  // Stage 3: every weight into the model (all-gathered where freed), and back. Every
  // rank calls; between the two the model is whole (to save it, or read it).
  void gather_all();
  void release_gathered();

  // Step 1 after the backward: what the hooks did not reduce yet (stage 1: everything)
  // in bucket order, and the lookups' rows. Returns this rank's [shard] of the world's
  // gradient, per bucket (the optimizer may scale them in place).
  std::vector<at::Tensor> reduce_gradients();
  // Step 2: the L2 norm of the whole gradient from every rank's shards: parallel::grad_norm
  // below (one all-reduce, for one sharded model or several).
  // Step 4: bucket b's masters changed: the model's weights follow (stages 1, 2 gather
  // them now, stage 3 before their next use).
  void refresh(size_t b);
  // After the update: whatever of the frozen shards the step left gathered (a prefetch not
  // consumed, the backward's last unit) is freed, as refresh frees the trained buckets'
  // (measured without it: a layer's 165 kB held between steps).
  void release_frozen();

  // Bytes of the masters this rank holds (padding included), and what one step sends
  // (reduce-scatter + all-gathers) besides the lookup's rows; those are
  // lookup_row_bytes(n) for each lookup unit, n the most tokens a rank looked up in the
  // step (0 for stage 1, which has no hooks).
  int64_t master_bytes() const;
  int64_t step_bytes() const;
  int64_t lookup_row_bytes(int64_t max_tokens) const;

  // What the hooks (zero_hooks.h) do at a unit's points, by unit index.
  void gather_unit(int unit) { weights_.gather_unit(unit); }
  void release_unit(int unit) { weights_.release_unit(unit); }
  void prefetch_unit(int unit) { weights_.prefetch_unit(unit); }
  bool prefetched(int unit) const { return use_of(unit).prefetched; }
  void reduce_unit(int unit);  // no-op for a unit without a dense gradient
  // Stage 3: the unit's table read by rows, or null (a unit gathered whole).
  std::shared_ptr<RowShardedTable> row_table(int unit) const;
  // The lookup's gradient rows (LayerHooks::lookup_backward), kept until
  // reduce_gradients(), which all-gathers every rank's and adds those in this rank's shards.
  void keep_lookup_rows(int unit, const at::Tensor& token_ids, const at::Tensor& rows);

 private:
  struct Shard {
    GradBucket bucket;  // in the model's dtype; bucket.unit: its hooked unit or −1
    int64_t shard = 0;  // elements per rank: padded numel / P
    at::Tensor master;  // [shard], master dtype
    at::Tensor grad;    // [shard]: this step's reduced gradient (undefined until reduced)
  };
  // Row r: elements [r·S + first, r·S + first + n) of the bucket's gradient, in the
  // master dtype, as [P·n] (what one reduce-scatter round sends).
  at::Tensor pack_grad_round(const Shard& s, int64_t first, int64_t n) const;
  void reduce_bucket(Shard& s);
  void add_lookup_rows(int unit);
  bool is_lookup_unit(int unit) const;             // stages 2, 3: its gradient comes as rows
  const at::Tensor& lookup_table(int unit) const;  // a lookup unit's [V, h] weight
  void ensure_grad(Shard& s) const;                // s.grad, zeros until something is added
  bool dense_gradient(int unit) const;             // reduced from the model's gradients at after_backward / step
  const std::vector<size_t>& unit_shards(int unit) const;  // empty for a unit without buckets
  const ShardUnitUse& use_of(int unit) const;

  model::NamedParams model_;
  model::NamedParams frozen_;  // stage 3: the frozen parameters of units read whole
  struct FrozenShard {
    GradBucket bucket;  // its params index frozen_
    int64_t shard = 0;
    at::Tensor values;  // [shard] in the model's dtype
  };
  std::vector<FrozenShard> frozen_shards_;
  dist::GroupPtr world_;
  at::ScalarType master_dtype_;
  std::vector<Shard> shards_;
  std::vector<ShardPiece> pieces_;
  std::vector<std::vector<size_t>> unit_buckets_;             // hooked unit → its buckets
  std::vector<ShardUnitUse> uses_;                            // by unit
  std::vector<std::shared_ptr<RowShardedTable>> row_tables_;  // by unit (null: gathered whole)
  struct LookupRows {
    at::Tensor ids, rows;  // [n] int64, [n, h] in the model's dtype
  };
  std::vector<std::vector<LookupRows>> lookup_rows_;  // by unit: this step's, until reduce_gradients()
  ShardLevel level_;
  ShardedWeights weights_;  // the model's weights from the masters: gathered, prefetched, freed
};

// The L2 norm of a gradient held by several sharded models of one model whose shards
// together hold each element once over `world` (expert parallelism: the dense weights
// sharded over the world, the experts over the ranks holding the same experts): every
// rank's Σ g² of its shards of each, one fp64 all-reduce over `world`. `grads[i]`:
// models[i]'s reduce_gradients(). A non-finite norm is an mmsp::Error on every rank
// naming the first parameter of this rank's shards with a non-finite gradient.
double grad_norm(const std::vector<const ShardedModel*>& models, const std::vector<std::vector<at::Tensor>>& grads,
                 dist::Group& world);

}  // namespace mmsp::parallel
