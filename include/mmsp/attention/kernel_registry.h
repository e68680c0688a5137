// The local attention kernels, one entry each in a table (kernel_registry.cpp), each in a
// folder of its own (src/attention/kernels/<name>/): how it plans a pair of token layouts,
// which tensors it serves, and its forward and backward apart — the forward giving the
// output and the log-sum-exp that the ring merges, the backward taking the final output
// and lse. `--attention-kernel NAME` pins one entry; `auto` takes, per call, the first entry
// in the table's order that is automatic on the tensors' device, planned the layouts and
// serves the tensors, and the blockwise kernel (the table's last, serving every tensor)
// otherwise. docs/attention.md shows adding a kernel as a worked diff.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mmsp/attention/token_layout.h"

namespace mmsp::attention {

struct AttentionOptions;
struct PartialAttention;
struct AttentionGrads;

// A kernel's plan of one pair of layouts (its own type; the kernel casts it back).
struct KernelPart {
  virtual ~KernelPart() = default;
};

class LocalKernel {
 public:
  virtual ~LocalKernel() = default;
  // Its name in --attention-kernel, logs and benchmarks.
  virtual const char* name() const = 0;
  // Whether `auto` considers it for tensors on `device` (a kernel measured slower than the
  // blockwise one there is not).
  virtual bool automatic_on(const at::Device& device) const = 0;
  // Its plan of the layouts (pure host work, index tensors made on `device`), or null with
  // `why_not` set when the layouts do not suit it.
  virtual std::shared_ptr<const KernelPart> plan(const TokenLayout& q, const TokenLayout& k,
                                                 const AttentionOptions& options, const at::Device& device,
                                                 std::string* why_not) const = 0;
  // The implementation that serves these query tensors (device, dtype, head size), by name
  // ("flash-varlen", "cpu-flash", ...), or nullptr with `why_not` set.
  virtual const char* serves(const at::Tensor& q, std::string* why_not) const = 0;
  // out [Tq, H, D] in q's dtype and lse [Tq, H] in the accumulation dtype (fp64 for fp64,
  // else fp32); a query with no allowed key gets out 0 and lse -inf.
  virtual PartialAttention forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const KernelPart& plan, const AttentionOptions& options) const = 0;
  // dq, dk, dv given dout and the FINAL out and lse of the queries (over every key set they
  // attend to, as after a ring), in the accumulation dtype.
  virtual AttentionGrads backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& out, const at::Tensor& lse, const KernelPart& plan,
                                  const AttentionOptions& options) const = 0;
};

// Every kernel, in auto's order of preference; the last is the blockwise kernel.
const std::vector<const LocalKernel*>& local_kernels();
// "fused, cudnn, blockwise": the names --attention-kernel takes besides auto.
std::string kernel_names();

// Which kernel runs the local attention: automatic (null), or one entry pinned by name
// (tests and benchmarks pin it; a pinned kernel that cannot serve is an error naming why).
struct AttentionKernel {
  const LocalKernel* pinned = nullptr;
  bool automatic() const { return pinned == nullptr; }
  bool operator==(const AttentionKernel& other) const { return pinned == other.pinned; }
  bool operator!=(const AttentionKernel& other) const { return pinned != other.pinned; }
};

// "auto" or a registry entry's name; anything else is an error naming the value and the names.
AttentionKernel parse_attention_kernel(const std::string& text);
const char* attention_kernel_name(AttentionKernel kernel);  // "auto" or the entry's name

}  // namespace mmsp::attention
