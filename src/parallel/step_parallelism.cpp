// A step's groups made into the Vlm's StepParallelism; see step_parallelism.h.
#include "mmsp/parallel/step_parallelism.h"

#include "mmsp/parallel/decoder_attention.h"
#include "mmsp/model/rank_inputs.h"

namespace mmsp::parallel {

model::StepParallelism parallelize_step(const model::Vlm& vlm, const model::RankInputs& inputs,
                                        const plan::StepPlan& plan, const StepGroups& groups, model::VisionMode mode,
                                        const attention::AttentionOptions& attention) {
  const at::Device device = vlm.decoder().model->embed_tokens->weight.device();
  auto plan_attention = [inputs, text = vlm.config().text, groups, attention, device] {
    return plan_decoder_attention(inputs, text, {groups.ring, groups.ulysses}, attention, device);
  };
  return {std::move(plan_attention), vision_router(plan, groups.context, mode)};
}

model::StepOutput forward_step(const model::Vlm& vlm, const plan::Batch& batch, const plan::StepPlan& plan,
                               const model::PixelInputs& pixels, const StepGroups& groups, model::VisionMode mode,
                               const attention::AttentionOptions& attention) {
  const model::RankInputs inputs = model::rank_inputs(batch, plan);
  return vlm.forward(inputs, plan, pixels, parallelize_step(vlm, inputs, plan, groups, mode, attention));
}

}  // namespace mmsp::parallel
