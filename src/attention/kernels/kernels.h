// Each kernel folder's entry, for the registry's table (kernel_registry.cpp): one line
// here and one there add a kernel. Private to attention/.
#pragma once

#include "mmsp/attention/kernel_registry.h"

namespace mmsp::attention {

const LocalKernel& cudnn_kernel();      // kernels/cudnn/
const LocalKernel& fused_kernel();      // kernels/fused/
const LocalKernel& blockwise_kernel();  // kernels/blockwise/

}  // namespace mmsp::attention
