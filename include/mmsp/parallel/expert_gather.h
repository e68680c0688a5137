// Expert parallelism: the whole model's tensors from each rank's share, gathered over the
// expert group (weights, gradients, optimizer moments: what a checkpoint, --save-gradients
// and the tests' final weights need whole). Each MoE layer's fused expert tensor becomes
// every rank's rows in rank order; the per-expert layout's experts come under their own
// indices; the other tensors are as they are. The order is the one process's. Every rank
// of the group calls it, with the same names in the same order.
#pragma once

#include "mmsp/dist/group.h"
#include "mmsp/model/config/moe_config.h"
#include "mmsp/model/named_params.h"

namespace mmsp::parallel {

model::NamedParams gather_experts(const model::NamedParams& local, const model::MoeConfig& moe,
                                  const dist::GroupPtr& experts);

}  // namespace mmsp::parallel
