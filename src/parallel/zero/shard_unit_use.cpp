// The units as ZeRO sees them; see shard_unit_use.h.
#include "mmsp/parallel/zero/shard_unit_use.h"

#include <unordered_map>

namespace mmsp::parallel {

std::vector<ShardUnitUse> shard_unit_uses(const std::vector<model::HookUnit>& units) {
  std::vector<ShardUnitUse> uses;
  for (const model::HookUnit& u : units)
    uses.push_back(ShardUnitUse{u.forward_uses + (u.backward_hooks ? 1 : 0), u.backward_hooks, u.prefetched,
                                u.lookup_rows, u.vocab_rows});
  return uses;
}

std::vector<int> unit_index_of(const model::NamedParams& params, const std::vector<model::HookUnit>& units) {
  std::unordered_map<const c10::TensorImpl*, int> unit_of;
  for (size_t unit = 0; unit < units.size(); ++unit)
    for (const at::Tensor& t : units[unit].parameters) unit_of[t.unsafeGetTensorImpl()] = static_cast<int>(unit);
  std::vector<int> out;
  for (const auto& [name, p] : params) {
    const auto it = unit_of.find(p.unsafeGetTensorImpl());
    out.push_back(it == unit_of.end() ? -1 : it->second);
  }
  return out;
}

}  // namespace mmsp::parallel
