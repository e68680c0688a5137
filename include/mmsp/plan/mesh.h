// The device mesh as a value: world = dp × ring × ulysses, ulysses fastest-varying
// (neighbouring ranks share the all-to-all), then ring, then dp; a rank's context
// (sequence-parallel) group is its ring × ulysses block. Pure index arithmetic — the
// coordinates of a rank and the members of each axis's group — used by the planner and
// by dist::Mesh, which joins the ranks and builds the process groups; no communication.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mmsp::plan {

enum class Layout { zigzag, contiguous };
Layout parse_layout(const std::string& name);
const char* to_string(Layout layout);

struct Mesh {
  int dp = 1;       // data-parallel replicas
  int ring = 1;     // ring-attention degree (K/V travel round the ring)
  int ulysses = 1;  // Ulysses degree (all-to-all tokens <-> heads)

  int world() const { return dp * ring * ulysses; }
  int context() const { return ring * ulysses; }  // sequence-parallel group size
  std::string str() const;                        // "dp(1) × ring(2) × ulysses(2)"
};

struct RankCoords {
  int dp = 0, ring = 0, ulysses = 0;
  int context_rank(const Mesh& mesh) const { return ring * mesh.ulysses + ulysses; }
};

// Throws mmsp::Error unless every factor is >= 1, the world is at most 2^24 ranks and,
// when world_size >= 0, the factors multiply to it:
// "world size 6 is not dp(1) × ring(2) × ulysses(2) = 4; choose --dp, ...".
void validate_mesh(const Mesh& mesh, int64_t world_size = -1);

// Parses "DxRxU" (e.g. "1x2x2"); throws on anything else.
Mesh parse_mesh(const std::string& text);

// Every factorisation dp × ring × ulysses of world_size, in a fixed order.
std::vector<Mesh> all_meshes(int world_size);

RankCoords rank_coords(const Mesh& mesh, int rank);  // throws unless 0 <= rank < world
int global_rank(const Mesh& mesh, const RankCoords& coords);  // the inverse of rank_coords

// Global ranks of the group along an axis that contains `rank`, ordered by the
// group-local rank. Context = ring × ulysses block; dp = same (ring, ulysses).
enum class MeshAxis { world, dp, ring, ulysses, context };
const char* axis_name(MeshAxis axis);
std::vector<int> group_members(const Mesh& mesh, MeshAxis axis, int rank);

}  // namespace mmsp::plan
