// A step's groups made into the Vlm's StepParallelism; see step_parallelism.h.
#include "mmsp/model/step_parallelism.h"

namespace mmsp::model {

StepParallelism parallelize_step(const Vlm& vlm, const RankInputs& inputs, const plan::StepPlan& plan,
                                 const StepGroups& groups, VisionMode mode,
                                 const attention::AttentionOptions& attention) {
  const at::Device device = vlm.decoder().model->embed_tokens->weight.device();
  auto plan_attention = [inputs, text = vlm.config().text, groups, attention, device] {
    return plan_decoder_attention(inputs, text, {groups.ring, groups.ulysses}, attention, device);
  };
  return {std::move(plan_attention), vision_router(plan, groups.context, mode)};
}

StepOutput forward_step(const Vlm& vlm, const plan::Batch& batch, const plan::StepPlan& plan,
                        const PixelInputs& pixels, const StepGroups& groups, VisionMode mode,
                        const attention::AttentionOptions& attention) {
  const RankInputs inputs = rank_inputs(batch, plan);
  return vlm.forward(inputs, plan, pixels, parallelize_step(vlm, inputs, plan, groups, mode, attention));
}

}  // namespace mmsp::model
