// ZeRO's gather, prefetch and free of the model's weights; see sharded_weights.h.
#include "mmsp/parallel/zero/sharded_weights.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "mmsp/core/check.h"

namespace mmsp::parallel {

namespace {

void check_owns_storage(const std::string& name, const at::Tensor& p) {
  const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
  MMSP_CHECK(p.is_contiguous() && p.storage_offset() == 0 && p.storage().nbytes() == bytes, "--shard parameters: \"",
             name, "\" shares its memory with other tensors (", p.storage().nbytes(), " bytes of storage for ", bytes,
             "); it cannot be freed between uses");
}

void free_storage(const at::Tensor& p) {
  c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

void allocate_storage(const at::Tensor& p) {
  c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
  if (storage->nbytes() > 0) return;
  const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
  at::Allocator* allocator = storage->allocator() ? storage->allocator() : c10::GetAllocator(storage->device_type());
  storage->set_data_ptr_noswap(allocator->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace

ShardedWeights::ShardedWeights(model::NamedParams model, dist::GroupPtr world, bool frees, int64_t round_bytes)
    : model_(std::move(model)), world_(std::move(world)), frees_(frees), round_bytes_(round_bytes) {}

void ShardedWeights::add_bucket(const GradBucket& layout, int64_t shard, at::Tensor master, bool prefetched,
                                bool by_rows) {
  if (frees_)
    for (size_t i : layout.params) check_owns_storage(model_[i].first, model_[i].second);
  if (layout.unit >= 0) {
    if (unit_buckets_.size() <= static_cast<size_t>(layout.unit)) unit_buckets_.resize(layout.unit + 1);
    unit_buckets_[layout.unit].push_back(buckets_.size());
  }
  Bucket b;
  b.layout = layout;
  b.shard = shard;
  b.master = std::move(master);
  b.prefetched = prefetched;
  b.by_rows = by_rows && frees_;
  release(b);  // stage 3: the whole weights go as their shards are taken, not all at the end
  buckets_.push_back(std::move(b));
}

const std::vector<size_t>& ShardedWeights::unit_buckets(int unit) const {
  static const std::vector<size_t> none;
  return unit >= 0 && static_cast<size_t>(unit) < unit_buckets_.size() ? unit_buckets_[unit] : none;
}

int64_t ShardedWeights::elements_per_round(at::ScalarType dtype) const {
  const int64_t per_rank = static_cast<int64_t>(world_->size()) * static_cast<int64_t>(c10::elementSize(dtype));
  return std::max<int64_t>(1, round_bytes_ / per_rank);
}

void ShardedWeights::gather_unit(int unit) {
  for (size_t b : unit_buckets(unit))
    if (!buckets_[b].by_rows) gather(buckets_[b]);
}

void ShardedWeights::release_unit(int unit) {
  for (size_t b : unit_buckets(unit)) release(buckets_[b]);
}

void ShardedWeights::prefetch_unit(int unit) {
  for (size_t b : unit_buckets(unit))
    if (frees_ && buckets_[b].prefetched && !buckets_[b].by_rows) start_gather(buckets_[b]);
}

void ShardedWeights::gather_outside_units() {
  for (Bucket& b : buckets_)
    if (b.layout.unit < 0) gather(b);
}

void ShardedWeights::gather_all() {
  for (Bucket& b : buckets_) gather(b);
}

void ShardedWeights::release_all() {
  for (Bucket& b : buckets_) release(b);
}

void ShardedWeights::refresh(size_t index) {
  Bucket& b = buckets_.at(index);
  b.prefetch.wait();  // a prefetch not consumed (a step that failed midway) holds the old weights
  b.incoming = at::Tensor();
  if (frees_) {
    release(b);
    return;
  }
  b.gathered = false;
  gather(b);
}

void ShardedWeights::start_gather(Bucket& b) {
  if (b.gathered || b.prefetch.in_flight()) return;
  at::NoGradGuard no_grad;
  b.incoming = at::empty({b.shard * world_->size()}, at::TensorOptions().dtype(b.layout.dtype).device(b.layout.device));
  b.prefetch = dist::all_gather_into_async(b.master.to(b.layout.dtype), b.incoming, world_);
}

void ShardedWeights::gather(Bucket& b) {
  if (b.gathered) return;
  at::NoGradGuard no_grad;
  for (size_t i : b.layout.params) allocate_storage(model_[i].second);
  if (!b.incoming.defined()) {
    gather_in_rounds(b);  // not prefetched: gather now
  } else {
    b.prefetch.wait();
    unpack_bucket_range(model_, b.layout, 0, b.incoming);  // the padding past the bucket's end dropped
    b.incoming = at::Tensor();
  }
  b.gathered = true;
}

void ShardedWeights::gather_in_rounds(Bucket& b) {
  // At most round_bytes_ gathered per round, straight into the model: neither the whole
  // bucket, nor its shard in the model's dtype, nor the flat copy Gloo's all-gather
  // makes of its whole output is held at once (each would be a lone 248,320-row
  // embedding's 485 MiB in bf16, or a share of it). The bytes are those of one gather.
  const int64_t P = world_->size(), per_round = elements_per_round(b.layout.dtype);
  for (int64_t first = 0; first < b.shard; first += per_round) {
    const int64_t n = std::min(per_round, b.shard - first);
    at::Tensor rows = at::empty({P * n}, at::TensorOptions().dtype(b.layout.dtype).device(b.layout.device));
    dist::all_gather_into(b.master.narrow(0, first, n).to(b.layout.dtype), rows, *world_);
    for (int64_t r = 0; r < P; ++r)
      unpack_bucket_range(model_, b.layout, r * b.shard + first, rows.narrow(0, r * n, n));
  }
}

void ShardedWeights::release(Bucket& b) {
  if (!frees_ || !b.gathered) return;
  for (size_t i : b.layout.params) free_storage(model_[i].second);
  b.gathered = false;
}

}  // namespace mmsp::parallel
