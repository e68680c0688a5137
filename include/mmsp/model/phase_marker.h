// Backward time of a region of the model (the vision encoder) for the step's time
// split: identities whose backward enters and leaves a phase (core/phase_timer.h).
// The region's forward uses a PhaseScope; its backward runs between the two markers.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/core/phase_timer.h"

namespace mmsp::model {

// Put on the region's output: the backward enters `phase` when the gradient arrives.
at::Tensor enter_phase_in_backward(const at::Tensor& x, Phase phase);
// Put on the region's first differentiable tensor: the backward leaves `phase`.
at::Tensor leave_phase_in_backward(const at::Tensor& x, Phase phase);

}  // namespace mmsp::model
