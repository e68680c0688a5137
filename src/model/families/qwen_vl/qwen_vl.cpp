// The Qwen-VL model's parts and names; see qwen_vl.h.
#include "mmsp/model/families/qwen_vl/qwen_vl.h"

#include "mmsp/core/check.h"
#include "mmsp/model/families/qwen_vl/qwen_variant.h"
#include "mmsp/model/families/qwen_vl/qwen_vision.h"
#include "mmsp/model/families/qwen_vl/qwen_vision_config.h"

namespace mmsp::model {

std::shared_ptr<Vlm> build_qwen_vl(const ModelConfig& config) {
  MMSP_CHECK(qwen_vision_of(config), "model_type ", config.model_type,
             " has no Qwen vision encoder (the Qwen-VL family serves qwen2_vl and qwen3_vl)");
  auto visual = std::make_shared<QwenVisionEncoder>(*qwen_vision_of(config), qwen_variant_of(config));
  auto decoder = std::make_shared<Decoder>(config.text, config.tie_word_embeddings);
  auto vlm = std::make_shared<Vlm>(config, decoder, visual);
  if (qwen_variant_of(config) == QwenVariant::qwen3_vl) {
    // model.visual.*, model.language_model.*, lm_head.*
    auto model = vlm->register_module("model", std::make_shared<torch::nn::Module>());
    model->register_module("visual", visual);
    model->register_module("language_model", decoder->model);
  } else {
    // visual.*, model.*, lm_head.*
    vlm->register_module("visual", visual);
    vlm->register_module("model", decoder->model);
  }
  if (decoder->lm_head) vlm->register_module("lm_head", decoder->lm_head);
  return vlm;
}

}  // namespace mmsp::model
