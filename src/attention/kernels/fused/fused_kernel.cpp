// The registry's "fused" entry: ATen's FlashAttention-2 varlen kernel on CUDA (bf16/fp16,
// head sizes that are multiples of 8 up to 256), ATen's CPU flash kernel on the CPU (only
// when pinned: measured slower there than the blockwise kernel), driven from the layouts'
// varlen calls (fused_attention.h).
#include "kernels/kernels.h"
#include "mmsp/attention/kernels/fused_attention.h"
#include "mmsp/attention/local_attention.h"

namespace mmsp::attention {
namespace {

struct FusedPart : KernelPart {
  FusedPlan plan;
};

double scale_of(const at::Tensor& q, const AttentionOptions& o) {
  return o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
}

class FusedKernel : public LocalKernel {
 public:
  const char* name() const override { return "fused"; }
  bool automatic_on(const at::Device& device) const override { return device.is_cuda(); }
  std::shared_ptr<const KernelPart> plan(const TokenLayout& q, const TokenLayout& k, const AttentionOptions& options,
                                         const at::Device& device, std::string* why_not) const override {
    std::optional<FusedPlan> fused = plan_fused(q, k, options.causal, device, why_not);
    if (!fused) return nullptr;
    auto part = std::make_shared<FusedPart>();
    part->plan = std::move(*fused);
    return part;
  }
  const char* serves(const at::Tensor& q, std::string* why_not) const override { return fused_kernel_for(q, why_not); }
  PartialAttention forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KernelPart& plan,
                           const AttentionOptions& options) const override {
    return fused_attention_forward(q, k, v, static_cast<const FusedPart&>(plan).plan, scale_of(q, options));
  }
  AttentionGrads backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const KernelPart& plan,
                          const AttentionOptions& options) const override {
    return fused_attention_backward(dout, q, k, v, out, lse, static_cast<const FusedPart&>(plan).plan,
                                    scale_of(q, options));
  }
};

}  // namespace

const LocalKernel& fused_kernel() {
  static const FusedKernel kernel;
  return kernel;
}

}  // namespace mmsp::attention
