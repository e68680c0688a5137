// Bucketed gradient all-reduce; see grad_sync.h.
#include "mmsp/parallel/grad_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iterator>

#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"

namespace mmsp::parallel {

std::vector<GradBucket> make_grad_buckets(const model::NamedParams& params, int64_t bucket_bytes,
                                          const std::vector<int>& unit_of) {
  MMSP_CHECK(unit_of.empty() || unit_of.size() == params.size(), "make_grad_buckets: ", unit_of.size(),
             " unit indices for ", params.size(), " parameters");
  const auto unit = [&](size_t i) { return unit_of.empty() ? -1 : unit_of[i]; };
  // (dtype, device) keys in order of first appearance; each key's open bucket.
  std::vector<GradBucket> out;
  std::vector<std::pair<std::pair<at::ScalarType, c10::Device>, std::vector<size_t>>> keys;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].second;
    const std::pair<at::ScalarType, c10::Device> key{p.scalar_type(), p.device()};
    auto it = std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return k.first == key; });
    if (it == keys.end()) {
      keys.push_back({key, {}});
      it = std::prev(keys.end());
    }
    it->second.push_back(i);
  }
  for (const auto& [key, members] : keys) {
    GradBucket open{key.first, key.second, {}, 0, 0};
    for (size_t i : members) {
      const at::Tensor& p = params[i].second;
      const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
      if (!open.params.empty() && (open.bytes + bytes > bucket_bytes || open.unit != unit(i))) {
        out.push_back(open);
        open = GradBucket{key.first, key.second, {}, 0, 0};
      }
      open.unit = unit(i);
      open.params.push_back(i);
      open.numel += p.numel();
      open.bytes += bytes;
    }
    if (!open.params.empty()) out.push_back(open);
  }
  return out;
}

namespace {

// Calls visit(i, in_param, in_range, n) for every parameter i of `bucket` that overlaps
// elements [first, last) of the bucket: n elements from the parameter's element
// in_param, which are the range's elements from in_range. Returns the bucket's numel.
template <typename Visit>
int64_t for_each_overlap(const model::NamedParams& params, const GradBucket& bucket, int64_t first, int64_t last,
                         Visit visit) {
  int64_t offset = 0;  // the parameter's first element in the bucket
  for (size_t i : bucket.params) {
    const int64_t numel = params[i].second.numel();
    const int64_t lo = std::max(first, offset), hi = std::min(last, offset + numel);
    if (lo < hi) visit(i, lo - offset, lo - first, hi - lo);
    offset += numel;
  }
  return offset;
}

}  // namespace

void pack_bucket_range(const model::NamedParams& params, const GradBucket& bucket, int64_t first, at::Tensor out,
                       const char* who) {
  at::NoGradGuard no_grad;
  const int64_t last = first + out.numel();
  auto pack = [&](size_t i, int64_t in_param, int64_t in_range, int64_t n) {
    const auto& [name, p] = params[i];
    at::Tensor slice = out.narrow(0, in_range, n);
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) {
      slice.zero_();
      return;
    }
    MMSP_CHECK(grad.sizes() == p.sizes(), who, ": the gradient of \"", name, "\" has shape ", grad.sizes(),
               " but the parameter has ", p.sizes());
    slice.copy_(grad.reshape({-1}).narrow(0, in_param, n));
  };
  const int64_t end = for_each_overlap(params, bucket, first, last, pack);
  if (last > end) out.narrow(0, std::max<int64_t>(0, end - first), last - std::max(first, end)).zero_();
}

void unpack_bucket_range(const model::NamedParams& params, const GradBucket& bucket, int64_t first,
                         const at::Tensor& in) {
  at::NoGradGuard no_grad;
  auto unpack = [&](size_t i, int64_t in_param, int64_t in_range, int64_t n) {
    params[i].second.variable_data().view({-1}).narrow(0, in_param, n).copy_(in.narrow(0, in_range, n));
  };
  for_each_overlap(params, bucket, first, first + in.numel(), unpack);
}

void pack_bucket_grads(const model::NamedParams& params, const GradBucket& bucket, at::Tensor& flat, const char* who) {
  pack_bucket_range(params, bucket, 0, flat.narrow(0, 0, bucket.numel), who);
}

GradSync::GradSync(model::NamedParams named_params, dist::GroupPtr world, int64_t bucket_bytes)
    : params_(std::move(named_params)), world_(std::move(world)) {
  MMSP_CHECK(world_, "GradSync: the world group is null");
  MMSP_CHECK(bucket_bytes > 0, "GradSync: bucket_bytes (", bucket_bytes, ") must be positive");
  model::check_named_params(params_, "GradSync");
  for (const auto& [name, p] : params_)
    MMSP_CHECK(at::isFloatingType(p.scalar_type()), "GradSync: parameter \"", name, "\" has dtype ", p.scalar_type(),
               "; only floating-point gradients are summed");
  buckets_ = make_grad_buckets(params_, bucket_bytes);
}

int64_t GradSync::grad_bytes() const {
  int64_t total = 0;
  for (const GradBucket& b : buckets_) total += b.bytes;
  return total;
}

void GradSync::all_reduce() {
  at::NoGradGuard no_grad;
  for (const GradBucket& bucket : buckets_) {
    // flat: [numel] of the bucket's dtype; parameter i's grad is a slice of it.
    at::Tensor flat = at::empty({bucket.numel}, at::TensorOptions().dtype(bucket.dtype).device(bucket.device));
    pack_bucket_grads(params_, bucket, flat, "GradSync");
    dist::all_reduce_(flat, *world_);
    int64_t offset = 0;
    for (size_t i : bucket.params) {
      at::Tensor& p = params_[i].second;
      at::Tensor slice = flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(slice);
      } else {
        p.mutable_grad() = slice.clone();  // its own storage, not a view of the bucket
      }
      offset += p.numel();
    }
  }
}

}  // namespace mmsp::parallel
