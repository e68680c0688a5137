// The step's mesh: world = dp x ring x ulysses, ulysses fastest-varying, then ring, then dp.
// A rank's context (sequence-parallel) group is its ring x ulysses block.
#pragma once

#include <cstdint>
#include <string>

namespace mmsp::plan {

enum class Layout { zigzag, contiguous };
Layout parse_layout(const std::string& name);
const char* to_string(Layout layout);

struct Mesh {
  int dp = 1;
  int ring = 1;
  int ulysses = 1;
  int world() const { return dp * ring * ulysses; }
  int context() const { return ring * ulysses; }
};

struct RankCoords {
  int dp = 0, ring = 0, ulysses = 0;
  int context_rank(const Mesh& mesh) const { return ring * mesh.ulysses + ulysses; }
};

// Every factor >= 1; when world_size >= 0 it must equal dp*ring*ulysses (message names each factor).
void validate_mesh(const Mesh& mesh, int64_t world_size = -1);
RankCoords rank_coords(const Mesh& mesh, int rank);
int rank_of(const Mesh& mesh, const RankCoords& coords);

}  // namespace mmsp::plan
