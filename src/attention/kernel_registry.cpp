// The table of local attention kernels and the --attention-kernel choice; see kernel_registry.h.
#include "mmsp/attention/kernel_registry.h"

#include "kernels/kernels.h"
#include "mmsp/core/check.h"

namespace mmsp::attention {

const std::vector<const LocalKernel*>& local_kernels() {
  // auto's order of preference where nothing was measured: the first that is automatic on
  // the device, planned the layouts and serves the tensors runs; blockwise serves every
  // tensor, so it closes the table. FlashAttention-2 varlen comes before cuDNN: a run that
  // did not measure (kernel_choice.h) keeps the kernel proven on GPUs; the trainer's auto on
  // CUDA measures both.
  static const std::vector<const LocalKernel*> kernels = {
      &fused_kernel(),
      &cudnn_kernel(),
      &blockwise_kernel(),
  };
  return kernels;
}

std::string kernel_names() {
  std::string out;
  for (const LocalKernel* k : local_kernels()) out += (out.empty() ? "" : ", ") + std::string(k->name());
  return out;
}

AttentionKernel parse_attention_kernel(const std::string& text) {
  if (text == "auto") return {};
  for (const LocalKernel* k : local_kernels())
    if (text == k->name()) return {k};
  MMSP_FAIL("attention kernel '", text, "' is not one of auto, ", kernel_names());
}

const char* attention_kernel_name(AttentionKernel kernel) {
  return kernel.automatic() ? "auto" : kernel.pinned->name();
}

}  // namespace mmsp::attention
