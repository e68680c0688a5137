// The preflight's parameter census; see parameter_census.h.
#include "parameter_census.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "mmsp/core/check.h"
#include "mmsp/model/layers/expert_names.h"

namespace mmsp::train {
namespace {

int64_t elements_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

ParameterCensus census_of(const ParameterLayout& layout, int64_t decoder_layers, bool trained_only) {
  MMSP_CHECK(layout.unit_of.size() == layout.shapes.size(), "estimate_memory: ", layout.unit_of.size(),
             " unit indices for ", layout.shapes.size(), " parameters");
  ParameterCensus c;
  std::vector<int64_t> per_unit(layout.uses.size(), 0);
  MMSP_CHECK(layout.frozen.empty() || layout.frozen.size() == layout.shapes.size(),
             "estimate_memory: ", layout.frozen.size(), " frozen flags for ", layout.shapes.size(), " parameters");
  for (size_t i = 0; i < layout.shapes.size(); ++i) {
    const int64_t n = elements_of(layout.shapes[i].second);
    const int unit = layout.unit_of[i];
    if (trained_only && !layout.frozen.empty() && layout.frozen[i]) continue;
    if (!layout.frozen.empty() && layout.frozen[i]) {
      c.frozen += n;
      if (unit < 0) c.frozen_kept += n;
    }
    MMSP_CHECK(unit < static_cast<int>(per_unit.size()), "estimate_memory: parameter \"", layout.shapes[i].first,
               "\" is in unit ", unit, " of ", per_unit.size());
    c.total += n;
    if (model::is_expert_parameter(layout.shapes[i].first)) c.experts += n;
    c.largest = std::max(c.largest, n);
    if (unit >= 0)
      per_unit[unit] += n;
    else
      c.largest_kept = std::max(c.largest_kept, n);
  }
  std::vector<int64_t> layers, blocks;  // decoder layers and vision blocks; the blocks alone
  // The decoder's layers are the first units (model::Vlm::hook_units: the decoder's layers,
  // its head and embedding, then the vision blocks).
  MMSP_CHECK(decoder_layers <= static_cast<int64_t>(per_unit.size()), "estimate_memory: ", decoder_layers,
             " decoder layers but ", per_unit.size(), " units");
  for (size_t u = 0; u < per_unit.size(); ++u) {
    const parallel::ShardUnitUse& use = layout.uses[u];
    if (static_cast<int64_t>(u) < decoder_layers) {
      MMSP_CHECK(!use.by_rows, "estimate_memory: unit ", u, " is read by rows, not a decoder layer");
      c.in_decoder_layers += per_unit[u];
    }
    if (!use.by_rows) {
      if (per_unit[u] > 0) layers.push_back(per_unit[u]);
      if (per_unit[u] > 0 && static_cast<int64_t>(u) >= decoder_layers) blocks.push_back(per_unit[u]);
    } else if (use.dense_gradient) {
      c.head += per_unit[u];
      c.tied = c.tied || use.lookup_rows;
    } else {
      c.embedding += per_unit[u];
    }
  }
  std::sort(layers.begin(), layers.end(), std::greater<>());
  std::sort(blocks.begin(), blocks.end(), std::greater<>());
  c.largest_block = blocks.empty() ? 0 : blocks[0];
  c.next_block = blocks.size() > 1 ? blocks[1] : 0;
  for (int64_t n : layers) c.in_layers += n;
  c.largest_layer = layers.empty() ? 0 : layers[0];
  c.next_layer = layers.size() > 1 ? layers[1] : 0;
  return c;
}

int64_t shard_elements(int64_t n, int64_t experts, const MemoryEstimateInputs& in) {
  const int64_t W = std::max(in.shard_world, 1), R = in.expert_shard_world > 0 ? in.expert_shard_world : W;
  return (n - experts + W - 1) / W + (experts + R - 1) / R;
}

}  // namespace mmsp::train
