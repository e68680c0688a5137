// The attended order of the gathered split-item tokens; see gathered_order.h.
#include "mmsp/model/vision/gathered_order.h"

#include <ATen/ATen.h>

#include "mmsp/attention/local_attention.h"
#include "mmsp/core/check.h"

namespace mmsp::model {

GatheredOrder GatheredOrder::make(const std::vector<int64_t>& perm, const std::vector<int64_t>& segment,
                                  const std::vector<int64_t>& order) {
  MMSP_ASSERT(perm.size() == segment.size() && perm.size() == order.size());
  GatheredOrder o;
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (!identity) {
    o.perm = at::tensor(at::ArrayRef<int64_t>(perm), at::kLong).clone();
    o.inverse = at::empty_like(o.perm);
    o.inverse.index_put_({o.perm}, at::arange(o.perm.size(0), at::kLong));
  }
  o.layout = {at::tensor(at::ArrayRef<int64_t>(segment), at::kLong).clone(),
              at::tensor(at::ArrayRef<int64_t>(order), at::kLong).clone()};
  return o;
}

at::Tensor GatheredOrder::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  attention::AttentionOptions options;
  options.causal = false;
  if (!perm.defined()) return attention::local_attention(q, k, v, layout, layout, options);
  const at::Tensor p = perm.to(q.device());
  at::Tensor out = attention::local_attention(q.index_select(0, p), k.index_select(0, p), v.index_select(0, p), layout,
                                              layout, options);
  return out.index_select(0, inverse.to(out.device()));
}

}  // namespace mmsp::model
