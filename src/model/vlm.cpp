// What every family's step returns; see vlm.h.
#include "mmsp/model/vlm.h"

#include <ATen/ATen.h>

namespace mmsp::model {

at::Tensor StepOutput::logits() const { return at::linear(hidden, head_weight); }

}  // namespace mmsp::model
