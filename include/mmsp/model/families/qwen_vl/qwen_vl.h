// The Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 model: the Qwen vision encoder as the
// tower (its deepstack rows ride beside the merger's, on the same routes in the same
// message) and the decoder, joined by the one VLM step (vlm.h). Parameter names are the
// checkpoints': Qwen2/2.5-VL visual.*, model.*, lm_head.*; Qwen3-VL model.visual.*,
// model.language_model.*, lm_head.*.
#pragma once

#include <memory>

#include "mmsp/model/config/config.h"
#include "mmsp/model/vlm.h"

namespace mmsp::model {

// Parameters are drawn from the current ATen generator (seed it for replicas): the
// tower's first, then the decoder's.
std::shared_ptr<Vlm> build_qwen_vl(const ModelConfig& config);

}  // namespace mmsp::model
