// One step of a mixture-of-experts VLM under sequence and expert parallelism, as the family
// tests run it (tests/model/families/qwen_vl for Qwen3-VL-MoE, hybrid for Qwen3.5-MoE):
// the model built from the same seed whichever experts the rank holds (every expert is
// drawn, moe_block.cpp), forward through parallel::forward_step with the mesh's expert
// group, the causal LM loss plus this rank's share of the auxiliary loss, backward, and
// the loss and every gradient whole: the dense ones summed over the world, the experts'
// over the ranks holding the same experts and gathered over the expert group — what one
// process computes, in its names and order (sp_compare.h compares them).
#pragma once

#include <ATen/ATen.h>

#include "mmsp/dist/all_reduce.h"
#include "mmsp/dist/mesh.h"
#include "mmsp/model/family.h"
#include "mmsp/model/layers/expert_names.h"
#include "mmsp/model/named_params.h"
#include "mmsp/parallel/expert_gather.h"
#include "mmsp/parallel/step_parallelism.h"
#include "mmsp/train/loss/causal_lm_loss.h"
#include "multirank.h"
#include "sp_compare.h"

namespace mmsp::test {

// The widest context mesh (ring 2 × ulysses W/2, or a ring of W) without expert
// parallelism, then it and the data-parallel mesh with each expert degree that splits both
// the world's ranks and `experts` (on 4 ranks: 2 and 4; on 2: 2). Built once, in the same
// order on every rank. Not every mesh of the world: the MoE layer adds nothing to what the
// dense families' cases check there, and CI's time is tight (docs/testing.md); the cases
// run on 2 and 4 ranks (moe_world_tested).
inline std::vector<const dist::Mesh*> moe_meshes(int experts) {
  static std::vector<dist::Mesh> meshes = [] {
    std::vector<dist::Mesh> out;
    const int world = rank_env().world_size;
    const int ring = world % 2 == 0 ? 2 : world;
    out.push_back(make_mesh(plan::Mesh{1, ring, world / ring, 1}));
    for (int e = 2; e <= world; e *= 2)
      if (world % e == 0)
        for (const plan::Mesh& shape : {plan::Mesh{1, ring, world / ring, e}, plan::Mesh{world, 1, 1, e}})
          out.push_back(make_mesh(shape));
    return out;
  }();
  std::vector<const dist::Mesh*> out;
  for (const dist::Mesh& m : meshes)
    if (experts % m.shape().expert == 0) out.push_back(&m);
  return out;
}

// Whether this world runs the MoE family cases: 2 and 4 ranks (every expert degree of the
// 8 experts that splits them); 1 rank is the reference itself, 3 splits no 8 experts.
inline bool moe_world_tested() {
  const int world = rank_env().world_size;
  return world == 2 || world == 4;
}

struct MoeStep {
  StepResult result;
  at::Tensor expert_counts;  // [sparse layers, E], every rank's picks
  double aux = 0;            // coef · aux, summed over the ranks
};

// `mesh` null: one process. The config's expert shard is set from the mesh's expert axis.
inline MoeStep run_moe_model(model::ModelConfig config, const plan::Batch& batch, const plan::StepPlan& plan,
                             const dist::Mesh* mesh, const model::PixelInputs& pixels,
                             model::ActivationCheckpointing checkpointing = model::ActivationCheckpointing::none) {
  const dist::GroupPtr solo = dist::make_solo_group("solo", 0);
  const int experts = mesh ? mesh->shape().expert : 1;
  model::set_expert_shard(config.text.moe, experts, mesh ? mesh->rank() % experts : 0);
  at::manual_seed(42);
  auto vlm = model::build_vlm(config);
  vlm->to(at::kDouble);
  vlm->set_activation_checkpointing(checkpointing);
  attention::AttentionOptions attn;
  attn.block_q = 8;
  attn.block_k = 8;
  const parallel::StepGroups groups =
      mesh ? parallel::StepGroups{mesh->context(), mesh->ring(), mesh->ulysses(), mesh->world(), mesh->expert()}
           : parallel::StepGroups{solo, solo, solo, solo, solo};
  const model::StepOutput out =
      parallel::forward_step(*vlm, batch, plan, pixels, groups, model::VisionMode::routed, attn);
  const at::Tensor loss = train::causal_lm_loss(out.logits(), out.labels, out.label_count);
  loss.backward();
  MoeStep step;
  at::Tensor total = at::full({2}, 0.0, at::kDouble);
  total[0] = loss.detach().item<double>() + out.aux_loss;
  total[1] = out.aux_loss;
  if (mesh) dist::all_reduce_(total, *mesh->world());
  step.result.loss = total[0].item<double>();
  step.aux = total[1].item<double>();
  step.expert_counts = out.expert_counts;
  model::NamedParams grads;
  for (const auto& [name, p] : model::named_parameters(*vlm)) {
    at::Tensor g = p.grad().defined() ? p.grad().clone() : at::zeros_like(p);
    if (mesh) dist::all_reduce_(g, model::is_expert_parameter(name) ? *mesh->expert_replica() : *mesh->world());
    grads.emplace_back(name, g);
  }
  step.result.grads = mesh ? parallel::gather_experts(grads, config.text.moe, mesh->expert()) : grads;
  return step;
}

}  // namespace mmsp::test
