// A step's groups made into the Vlm's StepParallelism; see step_parallelism.h.
#include "mmsp/parallel/step_parallelism.h"

#include "mmsp/core/check.h"
#include "mmsp/dist/all_reduce.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/parallel/decoder_attention.h"
#include "mmsp/parallel/expert_parallel.h"

namespace mmsp::parallel {

model::StepParallelism parallelize_step(const model::Vlm& vlm, const model::RankInputs& inputs,
                                        const plan::StepPlan& plan, const StepGroups& groups, model::VisionMode mode,
                                        const attention::AttentionOptions& attention) {
  const at::Device device = vlm.decoder().model->embed_tokens->weight.device();
  auto plan_attention = [inputs, text = vlm.config().text, groups, attention, device] {
    return plan_decoder_attention(inputs, text, {groups.ring, groups.ulysses}, attention, device);
  };
  model::StepParallelism out{std::move(plan_attention), vision_router(plan, groups.context, mode), {}, nullptr};
  if (vlm.config().text.moe.any()) {
    MMSP_CHECK(groups.batch, "a mixture-of-experts step needs the group of its batch's ranks (StepGroups::batch)");
    out.experts = expert_exchange(groups.expert);
    out.sum_over_batch = [batch = groups.batch](at::Tensor& counts) { dist::all_reduce_(counts, *batch); };
  }
  return out;
}

model::StepOutput forward_step(const model::Vlm& vlm, const plan::Batch& batch, const plan::StepPlan& plan,
                               const model::PixelInputs& pixels, const StepGroups& groups, model::VisionMode mode,
                               const attention::AttentionOptions& attention, double aux_loss_scale) {
  const model::RankInputs inputs = model::rank_inputs(batch, plan);
  model::StepParallelism parallelism = parallelize_step(vlm, inputs, plan, groups, mode, attention);
  parallelism.aux_loss_scale = aux_loss_scale;
  return vlm.forward(inputs, plan, pixels, parallelism);
}

}  // namespace mmsp::parallel
