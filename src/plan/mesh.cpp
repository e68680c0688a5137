// Mesh validation and coordinate arithmetic; see mesh.h.
#include "mmsp/plan/mesh.h"

#include <cstdio>
#include <sstream>

#include "mmsp/core/check.h"

namespace mmsp::plan {

Layout parse_layout(const std::string& name) {
  if (name == "zigzag") return Layout::zigzag;
  if (name == "contiguous") return Layout::contiguous;
  MMSP_FAIL("layout \"", name, "\" is unknown; use zigzag or contiguous");
}

const char* to_string(Layout layout) {
  return layout == Layout::zigzag ? "zigzag" : "contiguous";
}

std::string Mesh::str() const {
  std::ostringstream out;
  out << "dp(" << dp << ") × ring(" << ring << ") × ulysses(" << ulysses << ")";
  return out.str();
}

void validate_mesh(const Mesh& mesh, int64_t world_size) {
  MMSP_CHECK(mesh.dp >= 1 && mesh.ring >= 1 && mesh.ulysses >= 1, "mesh factors must be >= 1, got ", mesh.str());
  const int64_t product = int64_t{mesh.dp} * mesh.ring * mesh.ulysses;
  MMSP_CHECK(product <= (int64_t{1} << 24), "mesh ", mesh.str(), " = ", product,
             " ranks is beyond what the planner supports");
  MMSP_CHECK(world_size < 0 || product == world_size, "world size ", world_size, " is not ", mesh.str(), " = ",
             product, "; choose --dp, --ring and --ulysses whose product is ", world_size);
}

Mesh parse_mesh(const std::string& text) {
  Mesh mesh;
  char tail = 0;
  int n = std::sscanf(text.c_str(), "%dx%dx%d%c", &mesh.dp, &mesh.ring, &mesh.ulysses, &tail);
  MMSP_CHECK(n == 3 && mesh.dp >= 1 && mesh.ring >= 1 && mesh.ulysses >= 1,
             "mesh '", text, "' must read DPxRINGxULYSSES with factors >= 1, e.g. 1x2x2");
  return mesh;
}

std::vector<Mesh> all_meshes(int world_size) {
  std::vector<Mesh> meshes;
  for (int dp = 1; dp <= world_size; ++dp)
    for (int ring = 1; dp * ring <= world_size; ++ring)
      if (world_size % (dp * ring) == 0) meshes.push_back({dp, ring, world_size / (dp * ring)});
  return meshes;
}

RankCoords rank_coords(const Mesh& mesh, int rank) {
  MMSP_CHECK(rank >= 0 && rank < mesh.world(), "rank ", rank, " is outside the world of ", mesh.world(),
             " ranks (", mesh.str(), ")");
  RankCoords c;
  c.ulysses = rank % mesh.ulysses;
  c.ring = (rank / mesh.ulysses) % mesh.ring;
  c.dp = rank / (mesh.ulysses * mesh.ring);
  return c;
}

int global_rank(const Mesh& mesh, const RankCoords& c) {
  return (c.dp * mesh.ring + c.ring) * mesh.ulysses + c.ulysses;
}

const char* axis_name(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::world: return "world";
    case MeshAxis::dp: return "dp";
    case MeshAxis::ring: return "ring";
    case MeshAxis::ulysses: return "ulysses";
    case MeshAxis::context: return "context";
  }
  return "?";
}

std::vector<int> group_members(const Mesh& mesh, MeshAxis axis, int rank) {
  const RankCoords me = rank_coords(mesh, rank);
  std::vector<int> members;
  switch (axis) {
    case MeshAxis::world:
      for (int r = 0; r < mesh.world(); ++r) members.push_back(r);
      break;
    case MeshAxis::dp:
      for (int d = 0; d < mesh.dp; ++d) members.push_back(global_rank(mesh, {d, me.ring, me.ulysses}));
      break;
    case MeshAxis::ring:
      for (int r = 0; r < mesh.ring; ++r) members.push_back(global_rank(mesh, {me.dp, r, me.ulysses}));
      break;
    case MeshAxis::ulysses:
      for (int u = 0; u < mesh.ulysses; ++u) members.push_back(global_rank(mesh, {me.dp, me.ring, u}));
      break;
    case MeshAxis::context:
      for (int r = 0; r < mesh.ring; ++r)
        for (int u = 0; u < mesh.ulysses; ++u) members.push_back(global_rank(mesh, {me.dp, r, u}));
      break;
  }
  return members;
}

}  // namespace mmsp::plan
