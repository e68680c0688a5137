// The registry's "fused" kernel (kernels/fused/): local attention through ATen's
// FlashAttention-2 varlen kernel for CUDA tensors (bf16/fp16), ATen's CPU flash kernel for
// CPU tensors (used when asked for: it proves the same plan on machines without a GPU). The layouts are turned, once
// per step, into a few varlen calls whose segments never attend across and whose causal masks are the kernels' own
// (bottom-right aligned); the result is the same PartialAttention (out, fp32/fp64 log-sum-exp) the blockwise kernel
// gives, so the ring merges it and the backward takes the final out and lse unchanged.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mmsp/attention/token_layout.h"

namespace mmsp::attention {

struct PartialAttention;
struct AttentionGrads;

// One varlen kernel call: pieces of (query rows, key rows) packed one after another.
// A piece's queries attend its keys fully, or causally with the last query seeing every
// key (bottom-right aligned). A query row appears at most once per call.
struct VarlenPiece {
  int64_t q_begin = 0, q_length = 0;  // rows of the query layout
  int64_t k_begin = 0, k_length = 0;  // rows of the key layout
};
struct VarlenCall {
  bool causal = false;
  std::vector<VarlenPiece> pieces;
  at::Tensor q_rows, k_rows;  // int64 [packed] rows gathered, on the device; undefined = all, in order
  at::Tensor cum_q, cum_k;    // int32 [pieces + 1] piece starts in the packed rows, on the device
  int64_t max_q = 0, max_k = 0, total_q = 0, total_k = 0;
};

struct FusedPlan {
  int64_t queries = 0, keys = 0;
  std::vector<VarlenCall> calls;  // disjoint key sets per query row; merged by lse
};

// How a kernel's causal mask meets a piece with more keys than queries. FlashAttention's
// is bottom-right aligned (the last query sees every key). cuDNN's on packed sequences
// is top-left aligned (query i sees keys 0..i), which agrees with it on square pieces
// only: for such a kernel every causal piece is made square (its last q_length keys) and
// the keys before them go into a full piece of the same queries, merged by lse.
enum class CausalAlignment { bottom_right, square_only };

// The varlen calls for a pair of layouts, or nullopt with `why_not` set when the layouts
// are too fragmented for it (more pieces than `max_pieces`). Pure host work.
std::optional<FusedPlan> plan_fused(const TokenLayout& q_layout, const TokenLayout& k_layout, bool causal,
                                    const at::Device& device, std::string* why_not, int64_t max_pieces = 4096,
                                    CausalAlignment alignment = CausalAlignment::bottom_right);

// The fused kernel that serves these tensors, or nullptr with `why_not` set:
// "flash-varlen" (CUDA, bf16/fp16, head size a multiple of 8 up to 256) or "cpu-flash".
const char* fused_kernel_for(const at::Tensor& q, std::string* why_not);

PartialAttention fused_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const FusedPlan& plan, double scale);

// One varlen call of a kernel on the packed rows of its pieces: the forward's out [n, H, D]
// and lse [n, H]; the backward's dq, dk, dv of the packed rows. A kernel of this plan (the
// fused one, cuDNN's) supplies the two; the loops below gather the rows, merge the calls by
// lse and add the gradients back, the same for every such kernel.
using VarlenForward = std::function<PartialAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const VarlenCall& call, double scale)>;
using VarlenBackward =
    std::function<AttentionGrads(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& out, const at::Tensor& lse, const VarlenCall& call, double scale)>;
PartialAttention varlen_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const FusedPlan& plan, double scale, const VarlenForward& call);
AttentionGrads varlen_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                         const FusedPlan& plan, double scale, const VarlenBackward& call);

// dq, dk, dv given dout and the FINAL out and lse of the queries (as after a ring), in
// the accumulation dtype like the blockwise kernel's.
AttentionGrads fused_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                        const FusedPlan& plan, double scale);

}  // namespace mmsp::attention
