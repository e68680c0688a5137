// ZeRO-2/3's points around each hooked unit (model/hooks/layer_hooks.h): gather a unit's
// weights before each use and free them after it (stage 3), prefetch the next unit's,
// reduce-scatter its gradients once its backward is done, and take the token lookup's
// gradient as rows. The model calls them; the ShardedModel does the work.
#pragma once

#include <memory>
#include <vector>

#include "mmsp/model/hooks/layer_hooks.h"
#include "mmsp/parallel/zero/sharded_model.h"

namespace mmsp::parallel {

// The hooks of `sharded` for the model's units; null at stage 1 (which reduces after the
// backward and keeps every weight). The hooks keep `sharded` alive. `prefetch`: stage 3
// issues the next unit's gather before the current unit computes (off: each unit gathers
// its weights when it starts; the same weights arrive, bit for bit).
std::shared_ptr<model::LayerHooks> make_zero_hooks(const std::shared_ptr<ShardedModel>& sharded, bool prefetch = true);

// Several sharded models of one model, each a part of its parameters over a group of its
// own (expert parallelism: the dense weights over the world, the experts over the ranks
// holding the same experts), all of one level: each hook point does each model's work, in
// this order on every rank. The first holds the vocabulary units (the head's rows, the
// lookup's gradient rows); nulls are skipped.
std::shared_ptr<model::LayerHooks> make_zero_hooks(std::vector<std::shared_ptr<ShardedModel>> sharded,
                                                   bool prefetch = true);

}  // namespace mmsp::parallel
