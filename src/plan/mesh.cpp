// Mesh arithmetic: ranks are (dp, ring, ulysses) with ulysses fastest-varying.
#include "mmsp/plan/mesh.h"

#include "mmsp/core/check.h"

namespace mmsp::plan {

Layout parse_layout(const std::string& name) {
  if (name == "zigzag") return Layout::zigzag;
  if (name == "contiguous") return Layout::contiguous;
  MMSP_CHECK(false, "layout \"", name, "\" is unknown; use zigzag or contiguous");
  return Layout::zigzag;
}

const char* to_string(Layout layout) {
  return layout == Layout::zigzag ? "zigzag" : "contiguous";
}

void validate_mesh(const Mesh& mesh, int64_t world_size) {
  MMSP_CHECK(mesh.dp >= 1 && mesh.ring >= 1 && mesh.ulysses >= 1, "mesh factors must be >= 1, got ",
             "dp(", mesh.dp, ") ring(", mesh.ring, ") ulysses(", mesh.ulysses, ")");
  const int64_t product = int64_t{mesh.dp} * mesh.ring * mesh.ulysses;
  MMSP_CHECK(product <= (int64_t{1} << 24), "mesh dp(", mesh.dp, ") * ring(", mesh.ring,
             ") * ulysses(", mesh.ulysses, ") = ", product, " ranks is beyond what the planner supports");
  MMSP_CHECK(world_size < 0 || product == world_size, "mesh dp(", mesh.dp, ") * ring(", mesh.ring,
             ") * ulysses(", mesh.ulysses, ") = ", product, " != world size (", world_size, ")");
}

RankCoords rank_coords(const Mesh& mesh, int rank) {
  MMSP_CHECK(rank >= 0 && rank < mesh.world(), "rank ", rank, " is outside the world of ",
             mesh.world(), " ranks (dp(", mesh.dp, ") * ring(", mesh.ring, ") * ulysses(",
             mesh.ulysses, "))");
  RankCoords c;
  c.ulysses = rank % mesh.ulysses;
  c.ring = (rank / mesh.ulysses) % mesh.ring;
  c.dp = rank / (mesh.ulysses * mesh.ring);
  return c;
}

int rank_of(const Mesh& mesh, const RankCoords& c) {
  return (c.dp * mesh.ring + c.ring) * mesh.ulysses + c.ulysses;
}

}  // namespace mmsp::plan
