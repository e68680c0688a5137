// ZeRO's layer hooks; see zero_hooks.h.
#include "mmsp/parallel/zero/zero_hooks.h"

#include "mmsp/core/check.h"

namespace mmsp::parallel {
namespace {

class ZeroHooks : public model::LayerHooks {
 public:
  ZeroHooks(std::vector<std::shared_ptr<ShardedModel>> sharded, bool prefetch)
      : sharded_(std::move(sharded)), prefetch_(prefetch) {}
  // A chain of units i, i+1, ... (each one `prefetched` but the first) runs forward in
  // that order and backward in the reverse one: each unit prefetches the next one.
  void before_forward(size_t unit) override {
    const int u = static_cast<int>(unit);
    for (const auto& s : sharded_) s->gather_unit(u);
    if (prefetch_)
      for (const auto& s : sharded_) s->prefetch_unit(u + 1);
  }
  void after_forward(size_t unit) override {
    for (const auto& s : sharded_) s->release_unit(static_cast<int>(unit));
  }
  void before_backward(size_t unit) override {
    const int u = static_cast<int>(unit);
    for (const auto& s : sharded_) s->gather_unit(u);
    if (prefetch_)
      for (const auto& s : sharded_)
        if (s->prefetched(u)) s->prefetch_unit(u - 1);
  }
  void after_backward(size_t unit) override {
    for (const auto& s : sharded_) {
      s->reduce_unit(static_cast<int>(unit));
      s->release_unit(static_cast<int>(unit));
    }
  }
  std::shared_ptr<model::RowShardedWeight> row_sharded(size_t unit) override {
    return sharded_.front()->row_table(static_cast<int>(unit));
  }
  void lookup_backward(size_t unit, const at::Tensor& token_ids, const at::Tensor& grad_rows) override {
    sharded_.front()->keep_lookup_rows(static_cast<int>(unit), token_ids, grad_rows);
  }

 private:
  std::vector<std::shared_ptr<ShardedModel>> sharded_;  // the first holds the vocabulary units
  bool prefetch_;
};

}  // namespace

std::shared_ptr<model::LayerHooks> make_zero_hooks(const std::shared_ptr<ShardedModel>& sharded, bool prefetch) {
  return make_zero_hooks(std::vector<std::shared_ptr<ShardedModel>>{sharded}, prefetch);
}

std::shared_ptr<model::LayerHooks> make_zero_hooks(std::vector<std::shared_ptr<ShardedModel>> sharded, bool prefetch) {
  std::vector<std::shared_ptr<ShardedModel>> present;
  for (auto& s : sharded)
    if (s) present.push_back(std::move(s));
  if (present.empty() || present.front()->level() == ShardLevel::optimizer) return nullptr;
  for (const auto& s : present)
    MMSP_CHECK(s->level() == present.front()->level(), "make_zero_hooks: sharded models of levels ",
               to_string(present.front()->level()), " and ", to_string(s->level()));
  return std::make_shared<ZeroHooks>(std::move(present), prefetch);
}

}  // namespace mmsp::parallel
