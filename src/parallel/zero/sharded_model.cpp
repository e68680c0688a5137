// The model's parameters sharded over the world (ZeRO 1-3); see sharded_model.h.
#include "mmsp/parallel/zero/sharded_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_gather_v.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/shard_collectives.h"
#include "mmsp/parallel/sum_of_squares.h"

namespace mmsp::parallel {

namespace {

model::NamedParams concat(model::NamedParams a, const model::NamedParams& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Bucket b's elements [r·S, (r+1)·S) of its parameters' flattened values (zeros past its end).
void copy_shard_from(const model::NamedParams& params, const GradBucket& bucket, int64_t begin, at::Tensor shard) {
  int64_t offset = 0;
  const int64_t end = begin + shard.numel();
  for (size_t i : bucket.params) {
    const at::Tensor& p = params[i].second;
    const int64_t first = std::max(begin, offset), last = std::min(end, offset + p.numel());
    if (first < last)
      shard.narrow(0, first - begin, last - first)
          .copy_(p.detach().reshape({-1}).narrow(0, first - offset, last - first));
    offset += p.numel();
  }
}

}  // namespace

ShardedModel::ShardedModel(model::NamedParams model_params, at::ScalarType master_dtype, dist::GroupPtr world,
                           int64_t bucket_bytes, ShardLevel level, std::vector<int> unit_of,
                           std::vector<ShardUnitUse> uses, model::NamedParams frozen,
                           const std::vector<int>& frozen_unit_of)
    : model_(std::move(model_params)),
      frozen_(level == ShardLevel::parameters ? std::move(frozen) : model::NamedParams{}),
      world_(std::move(world)),
      master_dtype_(master_dtype),
      uses_(std::move(uses)),
      level_(level),
      weights_(concat(model_, frozen_), world_, level == ShardLevel::parameters, 2 * bucket_bytes) {
  MMSP_CHECK(world_, "ShardedModel: the world group is null");
  MMSP_CHECK(level_ != ShardLevel::none, "ShardedModel: shard level none is the replicated update");
  model::check_named_params(model_, "ShardedModel");
  MMSP_CHECK(at::isFloatingType(master_dtype_), "ShardedModel: master dtype ", master_dtype_, " is not floating point");
  if (level_ == ShardLevel::optimizer) unit_of.clear();  // stage 1 reduces after the backward, in any buckets
  MMSP_CHECK(unit_of.empty() || unit_of.size() == model_.size(), "ShardedModel: ", unit_of.size(), " unit indices for ",
             model_.size(), " parameters");
  const int64_t P = world_->size(), r = world_->rank();
  at::NoGradGuard no_grad;
  for (const GradBucket& bucket : make_grad_buckets(model_, bucket_bytes, unit_of)) {
    Shard s;
    s.bucket = bucket;
    s.shard = (bucket.numel + P - 1) / P;
    // Stage 3's [V, h] tables alone in their bucket: row-aligned shards, read by rows.
    const at::Tensor& first_param = model_[bucket.params.front()].second;
    const bool by_rows = level_ == ShardLevel::parameters && bucket.unit >= 0 && use_of(bucket.unit).by_rows &&
                         bucket.params.size() == 1 && first_param.dim() == 2;
    if (by_rows)
      s.shard = RowShardedTable::rows_per_rank(first_param.size(0), static_cast<int>(P)) * first_param.size(1);
    const auto options = at::TensorOptions().dtype(master_dtype_).device(bucket.device);
    s.master = at::zeros({s.shard}, options);
    const int64_t begin = r * s.shard, end = begin + s.shard;  // my elements of the bucket
    int64_t offset = 0;
    for (size_t i : bucket.params) {
      const at::Tensor& p = model_[i].second;
      const int64_t first = std::max(begin, offset), last = std::min(end, offset + p.numel());
      if (first < last) {
        ShardPiece piece{i, first - offset, last - first, shards_.size(), first - begin};
        s.master.narrow(0, piece.shard_offset, piece.length)
            .copy_(p.detach().reshape({-1}).narrow(0, piece.param_offset, piece.length));
        pieces_.push_back(piece);
      }
      offset += p.numel();
    }
    if (bucket.unit >= 0) {
      if (unit_buckets_.size() <= static_cast<size_t>(bucket.unit)) unit_buckets_.resize(bucket.unit + 1);
      unit_buckets_[bucket.unit].push_back(shards_.size());
    }
    weights_.add_bucket(bucket, s.shard, s.master, use_of(bucket.unit).prefetched, by_rows);
    if (by_rows) {
      if (row_tables_.size() <= static_cast<size_t>(bucket.unit)) row_tables_.resize(bucket.unit + 1);
      const size_t index = shards_.size();
      row_tables_[bucket.unit] = std::make_shared<RowShardedTable>(
          first_param.size(0), first_param.size(1), s.master,
          [this, index] {
            ensure_grad(shards_[index]);
            return shards_[index].grad;
          },
          bucket.dtype, world_);
    }
    shards_.push_back(std::move(s));
  }
  if (frozen_.empty()) return;
  MMSP_CHECK(frozen_unit_of.size() == frozen_.size(), "ShardedModel: ", frozen_unit_of.size(), " unit indices for ",
             frozen_.size(), " frozen parameters");
  for (size_t i = 0; i < frozen_.size(); ++i)
    MMSP_CHECK(frozen_unit_of[i] >= 0 && !use_of(frozen_unit_of[i]).by_rows, "ShardedModel: frozen \"",
               frozen_[i].first, "\" is not in a unit read whole");
  model::check_named_params(concat(model_, frozen_), "ShardedModel");
  for (GradBucket bucket : make_grad_buckets(frozen_, bucket_bytes, frozen_unit_of)) {
    FrozenShard f;
    f.shard = (bucket.numel + P - 1) / P;
    f.values = at::zeros({f.shard}, at::TensorOptions().dtype(bucket.dtype).device(bucket.device));
    copy_shard_from(frozen_, bucket, r * f.shard, f.values);
    f.bucket = bucket;
    for (size_t& i : bucket.params) i += model_.size();  // weights_ holds the trained ones first
    weights_.add_bucket(bucket, f.shard, f.values, use_of(bucket.unit).prefetched);
    frozen_shards_.push_back(std::move(f));
  }
}

void ShardedModel::copy_frozen_from_model() {
  at::NoGradGuard no_grad;
  const int64_t r = world_->rank();
  for (FrozenShard& f : frozen_shards_) copy_shard_from(frozen_, f.bucket, r * f.shard, f.values);
}

void ShardedModel::copy_from_model() {
  at::NoGradGuard no_grad;
  for (const ShardPiece& piece : pieces_)
    master_piece(piece).copy_(
        model_[piece.param].second.detach().reshape({-1}).narrow(0, piece.param_offset, piece.length));
  copy_frozen_from_model();
}

void ShardedModel::zero_grad() {
  for (auto& [name, p] : model_) p.mutable_grad().reset();
  for (Shard& s : shards_) s.grad.reset();
  lookup_rows_.clear();
}

at::Tensor ShardedModel::master_piece(const ShardPiece& piece) const {
  return shards_.at(piece.bucket).master.narrow(0, piece.shard_offset, piece.length);
}

at::Tensor ShardedModel::pack_grad_round(const Shard& s, int64_t first, int64_t n) const {
  const int64_t P = world_->size();
  at::Tensor rows = at::empty({P, n}, at::TensorOptions().dtype(master_dtype_).device(s.bucket.device));
  for (int64_t r = 0; r < P; ++r) pack_bucket_range(model_, s.bucket, r * s.shard + first, rows[r], "ShardedModel");
  return rows.view({-1});
}

double grad_norm(const std::vector<const ShardedModel*>& models, const std::vector<std::vector<at::Tensor>>& grads,
                 dist::Group& world) {
  MMSP_CHECK(models.size() == grads.size(), "grad_norm: ", grads.size(), " gradient lists for ", models.size(),
             " sharded models");
  // Summed where the shards live, then read once (not one device-to-host copy a bucket).
  at::Tensor local;
  for (const auto& part : grads)
    for (const at::Tensor& g : part) local = local.defined() ? local + sum_of_squares(g) : sum_of_squares(g);
  at::Tensor sum = local.defined() ? local.cpu() : at::zeros({1}, at::kDouble);
  dist::all_reduce_(sum, world);
  const double norm = std::sqrt(sum.item<double>());
  if (std::isfinite(norm)) return norm;
  std::string culprit = "(none in this rank's shards)";
  for (size_t m = 0; m < models.size() && culprit[0] == '('; ++m)
    for (const ShardPiece& piece : models[m]->pieces())
      if (!grads[m][piece.bucket].narrow(0, piece.shard_offset, piece.length).isfinite().all().item<bool>()) {
        culprit = "\"" + models[m]->model_params()[piece.param].first + "\"";
        break;
      }
  MMSP_FAIL("gradient norm is ", norm, " (not finite); first parameter with a non-finite gradient ", "in rank ",
            world.rank(), "'s shard: ", culprit, ". Lower the learning rate or check the data");
}

void ShardedModel::reduce_bucket(Shard& s) {
  at::NoGradGuard no_grad;
  // In rounds of at most round_bytes_ packed per rank: a bucket far larger than the
  // others (one parameter, such as a 248,320-row embedding) is never packed or received
  // whole, which would hold two more copies of its gradient. The bytes are those of one
  // reduce-scatter of the whole bucket.
  const int64_t per_round = weights_.elements_per_round(master_dtype_);
  ensure_grad(s);
  for (int64_t first = 0; first < s.shard; first += per_round) {
    const int64_t n = std::min(per_round, s.shard - first);
    s.grad.narrow(0, first, n).add_(dist::reduce_scatter(pack_grad_round(s, first, n), *world_));
  }
  for (size_t i : s.bucket.params) model_[i].second.mutable_grad().reset();  // reduced: the memory goes back now
}

const std::vector<size_t>& ShardedModel::unit_shards(int unit) const {
  static const std::vector<size_t> none;
  return unit >= 0 && static_cast<size_t>(unit) < unit_buckets_.size() ? unit_buckets_[unit] : none;
}

const ShardUnitUse& ShardedModel::use_of(int unit) const {
  static const ShardUnitUse layer;
  return unit >= 0 && static_cast<size_t>(unit) < uses_.size() ? uses_[unit] : layer;
}

std::shared_ptr<RowShardedTable> ShardedModel::row_table(int unit) const {
  return unit >= 0 && static_cast<size_t>(unit) < row_tables_.size() ? row_tables_[unit] : nullptr;
}

bool ShardedModel::dense_gradient(int unit) const { return use_of(unit).dense_gradient && !row_table(unit); }

void ShardedModel::reduce_unit(int unit) {
  if (!dense_gradient(unit)) return;
  for (size_t b : unit_shards(unit)) reduce_bucket(shards_[b]);
}

void ShardedModel::ensure_grad(Shard& s) const {
  if (!s.grad.defined())
    s.grad = at::zeros({s.shard}, at::TensorOptions().dtype(master_dtype_).device(s.bucket.device));
}

bool ShardedModel::is_lookup_unit(int unit) const {
  return level_ != ShardLevel::optimizer && use_of(unit).lookup_rows && !unit_shards(unit).empty();
}

const at::Tensor& ShardedModel::lookup_table(int unit) const {
  return model_[shards_[unit_shards(unit).front()].bucket.params.front()].second;
}

void ShardedModel::keep_lookup_rows(int unit, const at::Tensor& token_ids, const at::Tensor& rows) {
  MMSP_CHECK(is_lookup_unit(unit), "ShardedModel: unit ", unit,
             " handed over lookup gradient rows, but it is not a lookup unit");
  MMSP_CHECK(token_ids.dim() == 1 && rows.dim() == 2 && rows.size(0) == token_ids.size(0), "ShardedModel: lookup rows ",
             rows.sizes(), " for token ids ", token_ids.sizes(), " (want [n, h] and [n])");
  if (lookup_rows_.size() <= static_cast<size_t>(unit)) lookup_rows_.resize(unit + 1);
  lookup_rows_[unit].push_back(LookupRows{token_ids.to(at::kLong), rows.detach()});
}

namespace {

// Adds rows[k] to row ids[k] of a [V, h] matrix whose flattened elements [first,
// first + piece.numel()) are `piece` (a shard may start or end inside a row).
void add_rows_to_piece(at::Tensor piece, int64_t first, int64_t h, const at::Tensor& ids, const at::Tensor& rows) {
  const int64_t last = first + piece.numel();
  const int64_t whole_begin = (first + h - 1) / h, whole_end = last / h;  // rows wholly inside
  if (whole_begin < whole_end) {
    const at::Tensor in = ((ids >= whole_begin) & (ids < whole_end)).nonzero().squeeze(1);
    piece.narrow(0, whole_begin * h - first, (whole_end - whole_begin) * h)
        .view({whole_end - whole_begin, h})
        .index_add_(0, ids.index_select(0, in) - whole_begin, rows.index_select(0, in).to(piece.scalar_type()));
  }
  // The rows cut by the piece's ends: their part inside it.
  std::vector<int64_t> cut;
  if (first % h != 0) cut.push_back(first / h);
  if (last % h != 0 && (cut.empty() || cut[0] != last / h)) cut.push_back(last / h);
  for (int64_t row : cut) {
    const int64_t begin = std::max(first, row * h), end = std::min(last, (row + 1) * h);
    if (begin >= end) continue;
    const at::Tensor in = (ids == row).nonzero().squeeze(1);
    if (in.numel() == 0) continue;
    const at::Tensor sum = rows.index_select(0, in).to(piece.scalar_type()).sum(0);
    piece.narrow(0, begin - first, end - begin).add_(sum.narrow(0, begin - row * h, end - begin));
  }
}

}  // namespace

void ShardedModel::add_lookup_rows(int unit) {
  at::NoGradGuard no_grad;
  const std::vector<size_t>& buckets = unit_shards(unit);
  const at::Tensor& weight = lookup_table(unit);
  MMSP_CHECK(weight.dim() == 2, "ShardedModel: lookup unit ", unit, " has a ", weight.dim(),
             "-d weight; a token lookup reads a [V, h] table");
  const int64_t h = weight.size(1);
  std::vector<LookupRows> mine =
      unit < static_cast<int>(lookup_rows_.size()) ? std::move(lookup_rows_[unit]) : std::vector<LookupRows>{};
  // ids and rows on the table's device on every rank (a rank without rows too), so that
  // every rank's gather takes the same backend.
  at::Tensor ids = at::empty({0}, weight.options().dtype(at::kLong).requires_grad(false)),
             rows = at::empty({0, h}, weight.options().requires_grad(false));
  if (!mine.empty()) {
    std::vector<at::Tensor> all_ids, all_rows;
    for (const LookupRows& l : mine)
      all_ids.push_back(l.ids.to(weight.device())), all_rows.push_back(l.rows.to(weight.scalar_type()));
    ids = at::cat(all_ids), rows = at::cat(all_rows);
  }
  MMSP_CHECK(rows.size(1) == h, "ShardedModel: lookup rows of width ", rows.size(1), " for a table of width ", h);
  // Every rank's rows: the counts first (they may differ), then ids and rows.
  const std::vector<int64_t> ones(world_->size(), 1);
  const at::Tensor counts_t = dist::all_gather_v(at::full({1}, ids.size(0), at::kLong), ones, world_);
  const std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + counts_t.numel());
  const at::Tensor world_ids = dist::all_gather_v(ids, counts, world_);
  const at::Tensor world_rows = dist::all_gather_v(rows, counts, world_);
  for (size_t b : buckets) ensure_grad(shards_[b]);
  for (const ShardPiece& piece : pieces_)
    if (shards_[piece.bucket].bucket.unit == unit && model_[piece.param].second.is_same(weight))
      add_rows_to_piece(shards_[piece.bucket].grad.narrow(0, piece.shard_offset, piece.length), piece.param_offset, h,
                        world_ids, world_rows);
}

void ShardedModel::gather_step_weights() { weights_.gather_outside_units(); }

void ShardedModel::gather_all() { weights_.gather_all(); }

void ShardedModel::release_gathered() { weights_.release_all(); }

std::vector<at::Tensor> ShardedModel::reduce_gradients() {
  at::NoGradGuard no_grad;
  // What the backward's hooks did not reduce yet (stage 1: everything), in bucket order
  // on every rank; a gradient that reached a layer after its hook is a bug in the hooks.
  for (Shard& s : shards_) {
    const bool dense = level_ == ShardLevel::optimizer || dense_gradient(s.bucket.unit);
    if (!s.grad.defined() && dense)
      reduce_bucket(s);
    else
      for (size_t i : s.bucket.params)
        MMSP_CHECK(!model_[i].second.grad().defined(), "ShardedModel: the gradient of \"", model_[i].first, "\" ",
                   dense ? "arrived after its unit's gradients were reduced"
                         : "is dense, but its unit's only gradient is the token lookup's rows");
  }
  // The lookups' rows, in unit order on every rank (each rank takes part, with or
  // without rows of its own).
  if (level_ != ShardLevel::optimizer)
    for (size_t unit = 0; unit < uses_.size(); ++unit)
      if (is_lookup_unit(static_cast<int>(unit))) add_lookup_rows(static_cast<int>(unit));
  lookup_rows_.clear();
  std::vector<at::Tensor> grads;  // [shard] per bucket: the world's sum
  for (Shard& s : shards_) {
    ensure_grad(s);  // a unit without a dense gradient, and no lookup
    grads.push_back(s.grad);
  }
  return grads;
}

void ShardedModel::refresh(size_t b) { weights_.refresh(b); }

void ShardedModel::release_frozen() {
  for (size_t f = 0; f < frozen_shards_.size(); ++f) weights_.refresh(shards_.size() + f);
}

int64_t ShardedModel::master_bytes() const {
  int64_t bytes = 0;
  for (const Shard& s : shards_) bytes += s.master.numel() * static_cast<int64_t>(s.master.element_size());
  return bytes;
}

int64_t ShardedModel::step_bytes() const {
  const int P = world_->size();
  int64_t bytes = 0;
  for (const Shard& s : shards_) {
    const int64_t padded = s.shard * P;
    // (a row-sharded head's rounds reduce-scatter as much, and gather it twice, in rounds
    // that pad to a multiple of their block; its lookups' rows are not counted here)
    if (level_ == ShardLevel::optimizer || use_of(s.bucket.unit).dense_gradient)
      bytes += dist::shard_collective_bytes(padded * static_cast<int64_t>(s.master.element_size()), P);
    const int64_t gather =
        dist::shard_collective_bytes(padded * static_cast<int64_t>(c10::elementSize(s.bucket.dtype)), P);
    // stage 3 gathers a unit before each use: a decoder layer before its forward and
    // before its backward, the head likewise (tied: and before the lookup), the untied
    // embedding before its lookup
    const int gathers = row_table(s.bucket.unit) ? (use_of(s.bucket.unit).dense_gradient ? 2 : 0)
                        : level_ == ShardLevel::parameters && s.bucket.unit >= 0 ? use_of(s.bucket.unit).gathers
                                                                                 : 1;
    bytes += gathers * gather;
  }
  // Stage 3's frozen shards: gathered with their unit, never reduced (a frozen tower has no
  // backward, so its blocks' second gather is an upper bound).
  for (const FrozenShard& f : frozen_shards_)
    bytes += use_of(f.bucket.unit).gathers *
             dist::shard_collective_bytes(f.shard * P * static_cast<int64_t>(c10::elementSize(f.bucket.dtype)), P);
  return bytes;
}

int64_t ShardedModel::lookup_row_bytes(int64_t max_tokens) const {
  const int64_t P = world_->size();
  int64_t bytes = 0;
  for (size_t unit = 0; unit < uses_.size(); ++unit) {
    if (!is_lookup_unit(static_cast<int>(unit))) continue;
    const at::Tensor& weight = lookup_table(static_cast<int>(unit));
    // all_gather_v sends its (padded) piece to each other rank: a count, then ids and rows
    bytes += (P - 1) * (8 + max_tokens * (8 + weight.size(1) * static_cast<int64_t>(weight.element_size())));
  }
  return bytes;
}

}  // namespace mmsp::parallel
