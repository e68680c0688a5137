// Planned attention bytes; see attention_cost.h.
#include "mmsp/plan/attention_cost.h"

#include <algorithm>

namespace mmsp::plan {

int64_t sent_kv_heads(const AttentionShape& shape, int ulysses) { return std::max<int64_t>(shape.kv_heads, ulysses); }

double ulysses_bytes(const AttentionShape& shape, int ulysses, int64_t tokens) {
  if (ulysses <= 1) return 0.0;
  const double U = ulysses;
  const double heads = 2.0 * shape.heads + 2.0 * static_cast<double>(sent_kv_heads(shape, ulysses));
  return 2.0 * static_cast<double>(shape.layers) * (U - 1) / U * static_cast<double>(tokens) * heads *
         static_cast<double>(shape.head_dim * shape.element_bytes);
}

double ulysses_bytes(const AttentionShape& shape, const std::vector<int64_t>& tokens, int rank) {
  const int U = static_cast<int>(tokens.size());
  if (U <= 1) return 0.0;
  double others = 0.0;
  for (int p = 0; p < U; ++p)
    if (p != rank) others += static_cast<double>(tokens[p]);
  const double heads = 2.0 * shape.heads + 2.0 * static_cast<double>(sent_kv_heads(shape, U));
  return static_cast<double>(shape.layers) * heads / U * ((U - 1) * static_cast<double>(tokens[rank]) + others) *
         static_cast<double>(shape.head_dim * shape.element_bytes);
}

double ring_bytes(const AttentionShape& shape, int ring, int ulysses, int64_t share) {
  if (ring <= 1) return 0.0;
  const double hops = 3.0 * ring - 2;
  const double heads = static_cast<double>(sent_kv_heads(shape, ulysses)) / ulysses;
  return static_cast<double>(shape.layers) * hops * 2.0 * static_cast<double>(share) * heads *
         static_cast<double>(shape.head_dim * shape.element_bytes);
}

}  // namespace mmsp::plan
