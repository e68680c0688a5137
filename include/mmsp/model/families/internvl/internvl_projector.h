// InternVL's projector (the original checkpoints' mlp1; transformers'
// InternVLMultiModalProjector): LayerNorm over the pixel-shuffled row, linear to the
// decoder's width, activation, linear. Names: multi_modal_projector.{layer_norm,
// linear_1, linear_2}. The pixel shuffle before it is pixel_shuffle.h.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "mmsp/model/layers/activation.h"
#include "mmsp/model/layers/linear.h"

namespace mmsp::model {

class InternVLProjector : public torch::nn::Module {
 public:
  // in_width = vision hidden_size · k² (k = 1/downsample_ratio); out_width = the decoder's hidden_size.
  InternVLProjector(int64_t in_width, int64_t out_width, const std::string& activation, double init_std);
  // rows [..., in_width] -> [..., out_width]
  at::Tensor forward(const at::Tensor& rows) const;

  std::shared_ptr<LayerNorm> layer_norm;
  std::shared_ptr<Linear> linear_1, linear_2;

 private:
  std::string activation_;
};

}  // namespace mmsp::model
