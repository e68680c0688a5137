// ZeRO's layer hooks; see zero_hooks.h.
#include "mmsp/parallel/zero/zero_hooks.h"

namespace mmsp::parallel {
namespace {

class ZeroHooks : public model::LayerHooks {
 public:
  ZeroHooks(std::shared_ptr<ShardedModel> sharded, bool prefetch) : sharded_(std::move(sharded)), prefetch_(prefetch) {}
  // A chain of units i, i+1, ... (each one `prefetched` but the first) runs forward in
  // that order and backward in the reverse one: each unit prefetches the next one.
  void before_forward(size_t unit) override {
    sharded_->gather_unit(static_cast<int>(unit));
    if (prefetch_) sharded_->prefetch_unit(static_cast<int>(unit) + 1);
  }
  void after_forward(size_t unit) override { sharded_->release_unit(static_cast<int>(unit)); }
  void before_backward(size_t unit) override {
    sharded_->gather_unit(static_cast<int>(unit));
    if (prefetch_ && sharded_->prefetched(static_cast<int>(unit))) sharded_->prefetch_unit(static_cast<int>(unit) - 1);
  }
  void after_backward(size_t unit) override {
    sharded_->reduce_unit(static_cast<int>(unit));
    sharded_->release_unit(static_cast<int>(unit));
  }
  std::shared_ptr<model::RowShardedWeight> row_sharded(size_t unit) override {
    return sharded_->row_table(static_cast<int>(unit));
  }
  void lookup_backward(size_t unit, const at::Tensor& token_ids, const at::Tensor& grad_rows) override {
    sharded_->keep_lookup_rows(static_cast<int>(unit), token_ids, grad_rows);
  }

 private:
  std::shared_ptr<ShardedModel> sharded_;
  bool prefetch_;
};

}  // namespace

std::shared_ptr<model::LayerHooks> make_zero_hooks(const std::shared_ptr<ShardedModel>& sharded, bool prefetch) {
  if (!sharded || sharded->level() == ShardLevel::optimizer) return nullptr;
  return std::make_shared<ZeroHooks>(sharded, prefetch);
}

}  // namespace mmsp::parallel
