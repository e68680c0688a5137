// Activation checkpointing: a layer run through recompute_in_backward keeps only its
// input; its backward runs the layer's forward again (with grad) and backpropagates
// through that, into the input and the layer's parameters. LibTorch's C++ API has no
// torch.utils.checkpoint, so this is one autograd Function. The collectives inside the
// layer (Ulysses all-to-all, ring exchange) run again in the backward, in the same
// order on every rank; nothing here depends on the rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mmsp::model {

class ActivationOffload;

// Which layers recompute in the backward (--checkpoint-activations).
enum class ActivationCheckpointing { none, decoder, all };  // all: decoder layers and vision blocks

ActivationCheckpointing parse_activation_checkpointing(const std::string& name);
const char* to_string(ActivationCheckpointing mode);

// y = layer(x), with layer's activations dropped after the forward and recomputed in the
// backward. `parameters` are every tensor `layer` reads that needs a gradient (the
// layer's weights): their gradients accumulate into .grad exactly as without
// recomputation. `layer` must be deterministic (no dropout) and must capture by value
// what it needs: it runs again after the caller's frame is gone. `offload` (non-null:
// --offload-activations) keeps x in host memory until the backward (activation_offload.h).
at::Tensor recompute_in_backward(std::function<at::Tensor(const at::Tensor&)> layer, const at::Tensor& x,
                                 const std::vector<at::Tensor>& parameters,
                                 const std::shared_ptr<ActivationOffload>& offload = nullptr);

}  // namespace mmsp::model
