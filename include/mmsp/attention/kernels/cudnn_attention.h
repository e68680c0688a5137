// The registry's "cudnn" kernel (kernels/cudnn/): local attention through cuDNN's
// packed-sequence ("ragged", THD) attention, aten::_cudnn_attention_forward/_backward with
// cum_seq_q / cum_seq_k, driven from the fused kernel's varlen plan (fused_attention.h) with
// one change: cuDNN's causal mask on packed sequences is top-left aligned, so every causal
// piece is square and the keys before it go into a full piece (CausalAlignment::square_only).
// Its limits, read from PyTorch 2.15's source (torch/nn/attention/varlen.py's
// _cudnn_rejection_reasons, aten/src/ATen/native/cudnn/MHA.cpp), are a pure function of the
// facts below, so the CPU tests check them; where one is hit the kernel does not serve and
// `auto` runs the next entry (docs/attention.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "mmsp/attention/kernels/fused_attention.h"

namespace mmsp::attention {

// cuDNN releases as cudnnGetVersion() gives them (9.18.0 = 91800).
inline constexpr long kCudnnMinVersion = 91800;         // packed attention on SM90/SM100
inline constexpr long kCudnnShortQueryVersion = 92400;  // validated for calls of max_q <= 128
inline constexpr int64_t kCudnnMaxHeadDim = 128;        // forward and backward, d_qk = d_v

// What decides whether cuDNN serves a query tensor.
struct CudnnFacts {
  bool cuda = false;
  std::string device;  // for the message
  at::ScalarType dtype = at::kFloat;
  int64_t head_dim = 0;
  long cudnn_version = 0;      // the runtime's, 0 when LibTorch has no cuDNN
  int sm_major = 0;            // the GPU's compute capability (major)
  bool deterministic = false;  // torch's deterministic algorithms on (not warn-only)
};

// This process's facts for `q` (the cuDNN runtime, the GPU's capability, torch's flags).
CudnnFacts cudnn_facts(const at::Tensor& q);
// Why cuDNN cannot serve tensors with these facts, naming the value and the rule; empty when it can.
std::string cudnn_refusal(const CudnnFacts& facts);

// The fused plan with square causal pieces; nullopt with `why_not` when the layouts are too
// fragmented or a call has max_q <= 128 and the runtime is older than 9.24 (cudnn_version 0:
// not checked, as on the CPU, where the kernel does not serve anyway).
std::optional<FusedPlan> plan_cudnn(const TokenLayout& q_layout, const TokenLayout& k_layout, bool causal,
                                    const at::Device& device, long cudnn_version, std::string* why_not,
                                    int64_t max_pieces = 4096);

// How this LibTorch lays out the log-sum-exp of a packed call: 2.15 returns [H, total_q]
// (FlashAttention's form), releases before it [total_q, H, 1]. The forward learns it and the
// backward hands cuDNN the lse back in the same form.
enum class CudnnLse { unknown = 0, heads_first = 1, rows_first = 2 };
// lse [n, H] from what the forward returned; `layout` set to the form seen. An unexpected
// shape is an error naming it.
at::Tensor cudnn_lse_rows(const at::Tensor& lse, int64_t heads, int64_t rows, CudnnLse* layout);
// lse [n, H] in the form `layout` says the backward takes (heads_first when unknown).
at::Tensor cudnn_lse_for_backward(const at::Tensor& lse_rows, CudnnLse layout);

}  // namespace mmsp::attention
