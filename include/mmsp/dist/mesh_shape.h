// The shape of the device mesh, world = dp × ring × ulysses with ulysses varying
// fastest (neighbouring ranks share the all-to-all), then ring, then dp; and the
// pure index arithmetic of coordinates and group members. No communication here.
#pragma once

#include <string>
#include <vector>

namespace mmsp::dist {

struct MeshShape {
  int dp = 1;       // data-parallel replicas
  int ring = 1;     // ring-attention degree (K/V travel round the ring)
  int ulysses = 1;  // Ulysses degree (all-to-all tokens <-> heads)

  int size() const { return dp * ring * ulysses; }
  int context_size() const { return ring * ulysses; }  // sequence-parallel group size
  std::string str() const;                              // "dp(1) × ring(2) × ulysses(2)"
};

struct MeshCoords {
  int dp = 0;
  int ring = 0;
  int ulysses = 0;
};

// Throws mmsp::Error unless every factor is >= 1 and they multiply to world_size,
// e.g. "world size 6 is not dp(1) × ring(2) × ulysses(2) = 4".
void check_mesh_shape(const MeshShape& shape, int world_size);

// Parses "DxRxU" (e.g. "1x2x2"); throws on anything else.
MeshShape parse_mesh_shape(const std::string& text);

// Every factorisation dp × ring × ulysses of world_size, in a fixed order.
std::vector<MeshShape> all_mesh_shapes(int world_size);

MeshCoords coords_of(const MeshShape& shape, int rank);
int rank_of(const MeshShape& shape, const MeshCoords& coords);

// Global ranks of the group along an axis that contains `rank`, ordered by the
// group-local rank. Context = ring × ulysses block; dp = same (ring, ulysses).
enum class MeshAxis { world, dp, ring, ulysses, context };
const char* axis_name(MeshAxis axis);
std::vector<int> group_members(const MeshShape& shape, MeshAxis axis, int rank);

}  // namespace mmsp::dist
