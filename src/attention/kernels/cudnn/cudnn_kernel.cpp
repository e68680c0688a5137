// The registry's "cudnn" entry: cuDNN's packed-sequence attention on CUDA (bf16/fp16, head
// sizes that are multiples of 8 up to 128, SM90/SM100, cuDNN >= 9.18), over the fused
// kernel's varlen calls with square causal pieces; see cudnn_attention.h for the limits.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <atomic>
#include <climits>
#include <cmath>

#include "kernels/kernels.h"
#include "mmsp/attention/kernels/cudnn_attention.h"
#include "mmsp/attention/local_attention.h"
#include "mmsp/core/check.h"

#ifdef MMSP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace mmsp::attention {
namespace {

std::string version_text(long v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

// cuDNN declares its ragged offsets int32: a packed tensor's rows × row stride must fit.
void check_offsets(const at::Tensor& x, const char* what) {
  MMSP_CHECK(x.size(0) * x.stride(0) <= INT_MAX, "cudnn attention: the packed ", what, " hold ", x.size(0), " rows of ",
             x.stride(0), " elements, past cuDNN's int32 offsets (", INT_MAX, "); use --attention-kernel fused");
}

// A causal call holds square pieces only: its key offsets are its query offsets (cuDNN's
// causal mask on packed sequences compares positions from each piece's start).
const at::Tensor& key_offsets(const VarlenCall& call) {
  MMSP_ASSERT(!call.causal || (call.max_q == call.max_k && call.total_q == call.total_k),
              "a cudnn causal call holds square pieces only");
  return call.causal ? call.cum_q : call.cum_k;
}

PartialAttention cudnn_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const VarlenCall& call,
                            double scale, std::atomic<int>& layout) {
  check_offsets(q, "queries");
  check_offsets(k, "keys");
  auto r = at::_cudnn_attention_forward(q, k, v, /*attn_bias=*/std::nullopt, call.cum_q, key_offsets(call), call.max_q,
                                        call.max_k, /*compute_log_sumexp=*/true, /*dropout_p=*/0.0, call.causal,
                                        /*return_debug_mask=*/false, std::optional<double>(scale));
  CudnnLse seen = CudnnLse::unknown;
  at::Tensor lse = cudnn_lse_rows(std::get<1>(r), q.size(1), call.total_q, &seen);
  layout.store(static_cast<int>(seen));
  return {std::get<0>(r), lse};
}

AttentionGrads cudnn_call_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                   const VarlenCall& call, double scale, CudnnLse layout) {
  // No dropout: the kernel never reads the philox state.
  const at::Tensor unused = at::zeros({2}, q.options().dtype(at::kLong));
  auto r = at::_cudnn_attention_backward(dout.contiguous(), q, k, v, out.contiguous(),
                                         cudnn_lse_for_backward(lse.to(at::kFloat), layout), unused, unused,
                                         /*attn_bias=*/at::Tensor(), call.cum_q, key_offsets(call), call.max_q,
                                         call.max_k, /*dropout_p=*/0.0, call.causal, std::optional<double>(scale));
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

struct CudnnPart : KernelPart {
  FusedPlan plan;
  // The lse form the forward met (CudnnLse), for the backward of the same plan.
  mutable std::atomic<int> lse_layout{0};
};

double scale_of(const at::Tensor& q, const AttentionOptions& o) {
  return o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
}

class CudnnKernel : public LocalKernel {
 public:
  const char* name() const override { return "cudnn"; }
  bool automatic_on(const at::Device& device) const override { return device.is_cuda(); }
  std::shared_ptr<const KernelPart> plan(const TokenLayout& q, const TokenLayout& k, const AttentionOptions& options,
                                         const at::Device& device, std::string* why_not) const override {
    const long version = device.is_cuda() ? at::detail::getCUDAHooks().versionRuntimeCuDNN() : 0;
    std::optional<FusedPlan> fused = plan_cudnn(q, k, options.causal, device, version, why_not);
    if (!fused) return nullptr;
    auto part = std::make_shared<CudnnPart>();
    part->plan = std::move(*fused);
    return part;
  }
  const char* serves(const at::Tensor& q, std::string* why_not) const override {
    const std::string refusal = cudnn_refusal(cudnn_facts(q));
    if (refusal.empty()) return "cudnn-varlen";
    if (why_not) *why_not = refusal;
    return nullptr;
  }
  PartialAttention forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const KernelPart& plan,
                           const AttentionOptions& options) const override {
    const auto& part = static_cast<const CudnnPart&>(plan);
    return varlen_attention_forward(
        q, k, v, part.plan, scale_of(q, options),
        [&part](const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp, const VarlenCall& call, double s) {
          return cudnn_call(qp.contiguous(), kp.contiguous(), vp.contiguous(), call, s, part.lse_layout);
        });
  }
  AttentionGrads backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const KernelPart& plan,
                          const AttentionOptions& options) const override {
    const auto& part = static_cast<const CudnnPart&>(plan);
    const auto layout = static_cast<CudnnLse>(part.lse_layout.load());
    return varlen_attention_backward(
        dout, q, k, v, out, lse, part.plan, scale_of(q, options),
        [layout](const at::Tensor& dop, const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp,
                 const at::Tensor& op, const at::Tensor& lp, const VarlenCall& call, double s) {
          return cudnn_call_backward(dop, qp.contiguous(), kp.contiguous(), vp.contiguous(), op, lp, call, s, layout);
        });
  }
};

}  // namespace

CudnnFacts cudnn_facts(const at::Tensor& q) {
  CudnnFacts f;
  f.cuda = q.is_cuda();
  f.device = q.device().str();
  f.dtype = q.scalar_type();
  f.head_dim = q.size(-1);
  auto& context = at::globalContext();
  f.deterministic = context.deterministicAlgorithms() && !context.deterministicAlgorithmsWarnOnly();
  if (!f.cuda) return f;
  const auto& hooks = at::detail::getCUDAHooks();
  f.cudnn_version = hooks.hasCuDNN() ? hooks.versionRuntimeCuDNN() : 0;
#ifdef MMSP_WITH_CUDA
  f.sm_major = at::cuda::getDeviceProperties(q.device().index())->major;
#endif
  return f;
}

std::string cudnn_refusal(const CudnnFacts& f) {
  if (!f.cuda) return "cuDNN attention runs on CUDA tensors; these are on " + f.device;
  if (f.dtype != at::kBFloat16 && f.dtype != at::kHalf)
    return std::string("cuDNN attention takes bf16/fp16, got ") + c10::toString(f.dtype);
  if (f.head_dim % 8 != 0 || f.head_dim > kCudnnMaxHeadDim)
    return "cuDNN attention (forward and backward) takes head sizes that are multiples of 8 up to " +
           std::to_string(kCudnnMaxHeadDim) + ", got " + std::to_string(f.head_dim);
  if (f.cudnn_version < kCudnnMinVersion)
    return "cuDNN's packed-sequence attention needs cuDNN >= " + version_text(kCudnnMinVersion) +
           ", this LibTorch has " + (f.cudnn_version == 0 ? std::string("none") : version_text(f.cudnn_version));
  if (f.sm_major != 9 && f.sm_major != 10)
    return "cuDNN's packed-sequence attention runs on SM90/SM100 GPUs (Hopper, Blackwell), this one is SM" +
           std::to_string(f.sm_major) + "x";
  if (f.deterministic)
    return "cuDNN attention's backward is not deterministic and torch's deterministic algorithms are on";
  return "";
}

std::optional<FusedPlan> plan_cudnn(const TokenLayout& q_layout, const TokenLayout& k_layout, bool causal,
                                    const at::Device& device, long cudnn_version, std::string* why_not,
                                    int64_t max_pieces) {
  std::optional<FusedPlan> plan =
      plan_fused(q_layout, k_layout, causal, device, why_not, max_pieces, CausalAlignment::square_only);
  if (!plan || cudnn_version == 0 || cudnn_version >= kCudnnShortQueryVersion) return plan;
  for (const VarlenCall& call : plan->calls)
    if (call.max_q <= 128) {
      if (why_not)
        *why_not = "a call's longest piece has " + std::to_string(call.max_q) + " queries; cuDNN " +
                   version_text(cudnn_version) + " is validated for max_q <= 128 from " +
                   version_text(kCudnnShortQueryVersion) + " on";
      return std::nullopt;
    }
  return plan;
}

at::Tensor cudnn_lse_rows(const at::Tensor& lse, int64_t heads, int64_t rows, CudnnLse* layout) {
  if (lse.dim() == 2 && lse.size(0) == heads && lse.size(1) == rows) {
    *layout = CudnnLse::heads_first;
    return lse.t();
  }
  if (lse.dim() == 3 && lse.size(0) == rows && lse.size(1) == heads && lse.size(2) == 1) {
    *layout = CudnnLse::rows_first;
    return lse.squeeze(-1);
  }
  MMSP_FAIL("cudnn attention: this LibTorch returns the log-sum-exp as ", lse.sizes(), ", neither [", heads, ", ", rows,
            "] nor [", rows, ", ", heads, ", 1]: run with --attention-kernel fused");
}

at::Tensor cudnn_lse_for_backward(const at::Tensor& lse_rows, CudnnLse layout) {
  return layout == CudnnLse::rows_first ? lse_rows.unsqueeze(-1).contiguous() : lse_rows.t().contiguous();
}

const LocalKernel& cudnn_kernel() {
  static const CudnnKernel kernel;
  return kernel;
}

}  // namespace mmsp::attention
