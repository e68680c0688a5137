// Mixed precision: fp32 master copies of the model's bf16 parameters. The model
// computes in its own dtype; the gradient reduction, clipping, AdamW and checkpoints
// work on the masters, so updates too small for bf16 still accumulate and a resumed
// run continues exactly. Without mixed precision (fp32 or fp64 training) the masters
// are the model's parameters themselves and every call here is free.
#pragma once

#include <ATen/core/Tensor.h>

#include "mmsp/model/named_params.h"

namespace mmsp::train {

// Usage, per step: forward/backward on the model; masters.take_grads(); sync, clip and
// step over masters.params(); masters.copy_to_model().
class MasterWeights {
 public:
  // `model_params`: the model's parameters (names unique, tensors distinct). With
  // master_dtype equal to their dtype the masters are those tensors; otherwise each
  // master is a detached copy converted to master_dtype, under the same name.
  MasterWeights(model::NamedParams model_params, at::ScalarType master_dtype);

  bool mixed() const { return mixed_; }
  at::ScalarType dtype() const { return dtype_; }
  // What the optimizer, gradient sync, clipping and checkpoints see.
  const model::NamedParams& params() const { return masters_; }
  const model::NamedParams& model_params() const { return model_; }

  // After backward: each master's grad = its parameter's grad converted (an undefined
  // grad stays undefined, so parallel::GradSync's zero-filling applies as for one dtype); the
  // model's low-precision grads are released.
  void take_grads();
  // After the optimizer step (or a load into the masters): every model parameter =
  // its master rounded to the model's dtype.
  void copy_to_model();

 private:
  model::NamedParams model_, masters_;
  at::ScalarType dtype_;
  bool mixed_ = false;
};

}  // namespace mmsp::train
