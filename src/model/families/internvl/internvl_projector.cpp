// InternVL's projector; see internvl_projector.h.
#include "mmsp/model/families/internvl/internvl_projector.h"

#include "mmsp/model/layers/activation.h"

namespace mmsp::model {

InternVLProjector::InternVLProjector(int64_t in_width, int64_t out_width, const std::string& activation,
                                     double init_std)
    : activation_(activation) {
  // nn.LayerNorm's default eps: transformers builds this one without the config's.
  layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(in_width, 1e-5));
  linear_1 = register_module("linear_1", std::make_shared<Linear>(in_width, out_width, true, init_std));
  linear_2 = register_module("linear_2", std::make_shared<Linear>(out_width, out_width, true, init_std));
}

at::Tensor InternVLProjector::forward(const at::Tensor& rows) const {
  return linear_2->forward(model::activation(activation_, linear_1->forward(layer_norm->forward(rows))));
}

}  // namespace mmsp::model
