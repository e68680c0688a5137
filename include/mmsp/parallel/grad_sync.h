// Gradient synchronisation: the world SUM of every parameter's gradient, in
// buckets. Each rank's loss is already divided by the global label count, so the
// sum (not the mean) is the exact gradient. What the grads are, and when to call,
// is the trainer's business; this file only packs, reduces and unpacks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "mmsp/dist/group.h"
#include "mmsp/model/named_params.h"

namespace mmsp::parallel {

constexpr int64_t kDefaultBucketBytes = 25 * 1024 * 1024;

// One flat buffer's worth of parameters: same dtype and device, in parameter order.
struct GradBucket {
  at::ScalarType dtype;
  c10::Device device{c10::kCPU};
  std::vector<size_t> params;  // indices into the GradSync's parameter list
  int64_t numel = 0;
  int64_t bytes = 0;  // numel × element size: what one all-reduce carries
  int unit = -1;      // the unit_of value its parameters share (see make_grad_buckets)
};

// The buckets GradSync uses (see its constructor): from the parameters' order,
// dtypes, devices and sizes only, so every rank builds the same ones.
// `unit_of` (empty, or one value per parameter) keeps apart what is gathered and reduced
// at different times (ZeRO-3's decoder layers): a bucket never holds two units.
std::vector<GradBucket> make_grad_buckets(const model::NamedParams& params, int64_t bucket_bytes,
                                          const std::vector<int>& unit_of = {});

// Writes each gradient of `bucket`'s parameters (zeros for an undefined one) into its
// slice of `flat` ([≥ bucket.numel], any floating dtype: converted on the way), in bucket
// order. A gradient of another shape is an error naming the parameter, prefixed `who`.
void pack_bucket_grads(const model::NamedParams& params, const GradBucket& bucket, at::Tensor& flat, const char* who);
// The same for elements [first, first + out.numel()) of the bucket's gradient, into
// `out` (1-D); elements past the bucket's end are zeros.
void pack_bucket_range(const model::NamedParams& params, const GradBucket& bucket, int64_t first, at::Tensor out,
                       const char* who);
// The other way, for weights: elements [first, first + in.numel()) of the bucket's
// parameters become `in` (1-D; elements past the bucket's end are dropped), written
// without bumping the parameters' versions (autograd may hold views of them).
void unpack_bucket_range(const model::NamedParams& params, const GradBucket& bucket, int64_t first,
                         const at::Tensor& in);

// Usage: GradSync sync(named_params, mesh.world());  ...backward...;  sync.all_reduce();
class GradSync {
 public:
  // Buckets are fixed here, from the parameters' order, dtypes, devices and sizes
  // only, so every rank (same model, same order) builds the same ones. Parameters
  // are grouped by (dtype, device) in order of first appearance; within a group,
  // consecutive parameters fill a bucket up to `bucket_bytes`; a parameter larger
  // than that is a bucket of its own. Names must be unique, tensors distinct
  // (a tied weight is passed once) and floating point.
  GradSync(model::NamedParams named_params, dist::GroupPtr world, int64_t bucket_bytes = kDefaultBucketBytes);

  // In place: every parameter's .grad() becomes the sum over the group. An
  // undefined grad counts as zeros and is defined afterwards (a rank whose batch
  // did not reach a parameter still takes part). One all-reduce per bucket, in
  // bucket order; at most one bucket's buffer is alive at a time. A one-member
  // group packs and unpacks too (so undefined grads become zeros) but moves nothing.
  void all_reduce();

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  const model::NamedParams& params() const { return params_; }
  // Sum of the gradients' bytes (the payload of one all_reduce(), all buckets).
  int64_t grad_bytes() const;

 private:
  model::NamedParams params_;
  dist::GroupPtr world_;
  std::vector<GradBucket> buckets_;
};

}  // namespace mmsp::parallel
