// The preflight's count of a run's parameters by what ZeRO does with them (memory_estimate.cpp).
#pragma once

#include <cstdint>

#include "mmsp/train/memory/memory_estimate.h"

namespace mmsp::train {

// The parameters by the units ZeRO hooks: decoder layers, hooked vision blocks, the
// head and an untied embedding, and what stays outside them.
struct ParameterCensus {
  int64_t total = 0;
  int64_t in_layers = 0;                      // in every layer and vision block
  int64_t in_decoder_layers = 0;              // ... of them in the decoder's layers
  int64_t largest_layer = 0, next_layer = 0;  // N_l, and N_l2: the most a neighbour of the largest holds
  int64_t largest_block = 0, next_block = 0;  // the same among the vision blocks alone
  int64_t head = 0, embedding = 0;            // tied: the embedding is the head's unit, embedding 0
  int64_t largest = 0;                        // the largest parameter
  int64_t largest_kept = 0;                   // the largest outside every unit
  bool tied = false;
  int64_t experts = 0;                  // the mixture-of-experts layers' expert weights (sharded over their replicas)
  int64_t frozen = 0, frozen_kept = 0;  // --freeze: in all, and outside every unit
  int64_t kept() const { return total - in_layers - head - embedding; }  // whole for the step under ZeRO-2/3
  int64_t trained() const { return total - frozen; }                     // what has masters, moments and gradients
};

// Counted from the units parallelize installs (the layout's, parallel::ShardUnitUse):
// a [V, h] table read by rows is the head when it has a dense gradient (tied when the
// lookup reads it too), else the untied embedding; every other unit is a layer or a
// vision block. `trained_only`: the parameters that train alone (--freeze, LoRA), which
// are what has gradients and, under ZeRO, shards to gather: a frozen one is neither.
ParameterCensus census_of(const ParameterLayout& layout, int64_t decoder_layers, bool trained_only = false);

// Elements of a rank's ZeRO shards of `n` elements of which `experts` are the expert
// weights: those over the expert replicas (MemoryEstimateInputs::expert_shard_world), the
// rest over the world (shard_world).
int64_t shard_elements(int64_t n, int64_t experts, const MemoryEstimateInputs& in);

}  // namespace mmsp::train
