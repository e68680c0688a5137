// Mesh shape validation and coordinate arithmetic; see mesh_shape.h.
#include "mmsp/dist/mesh_shape.h"

#include <cstdio>
#include <sstream>

#include "mmsp/core/check.h"

namespace mmsp::dist {

std::string MeshShape::str() const {
  std::ostringstream out;
  out << "dp(" << dp << ") × ring(" << ring << ") × ulysses(" << ulysses << ")";
  return out.str();
}

void check_mesh_shape(const MeshShape& shape, int world_size) {
  MMSP_CHECK(shape.dp >= 1 && shape.ring >= 1 && shape.ulysses >= 1,
             "mesh factors must be >= 1, got ", shape.str());
  MMSP_CHECK(shape.size() == world_size, "world size ", world_size, " is not ", shape.str(),
             " = ", shape.size(), "; choose --dp, --ring and --ulysses whose product is ",
             world_size);
}

MeshShape parse_mesh_shape(const std::string& text) {
  MeshShape shape;
  char tail = 0;
  int n = std::sscanf(text.c_str(), "%dx%dx%d%c", &shape.dp, &shape.ring, &shape.ulysses, &tail);
  MMSP_CHECK(n == 3 && shape.dp >= 1 && shape.ring >= 1 && shape.ulysses >= 1,
             "mesh '", text, "' must read DPxRINGxULYSSES with factors >= 1, e.g. 1x2x2");
  return shape;
}

std::vector<MeshShape> all_mesh_shapes(int world_size) {
  std::vector<MeshShape> shapes;
  for (int dp = 1; dp <= world_size; ++dp)
    for (int ring = 1; dp * ring <= world_size; ++ring)
      if (world_size % (dp * ring) == 0) shapes.push_back({dp, ring, world_size / (dp * ring)});
  return shapes;
}

MeshCoords coords_of(const MeshShape& shape, int rank) {
  MMSP_ASSERT(rank >= 0 && rank < shape.size(), "rank ", rank, " outside ", shape.str());
  return {rank / shape.context_size(), (rank / shape.ulysses) % shape.ring, rank % shape.ulysses};
}

int rank_of(const MeshShape& shape, const MeshCoords& c) {
  return (c.dp * shape.ring + c.ring) * shape.ulysses + c.ulysses;
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

std::vector<int> group_members(const MeshShape& shape, MeshAxis axis, int rank) {
  const MeshCoords me = coords_of(shape, rank);
  std::vector<int> members;
  switch (axis) {
    case MeshAxis::world:
      for (int r = 0; r < shape.size(); ++r) members.push_back(r);
      break;
    case MeshAxis::dp:
      for (int d = 0; d < shape.dp; ++d) members.push_back(rank_of(shape, {d, me.ring, me.ulysses}));
      break;
    case MeshAxis::ring:
      for (int r = 0; r < shape.ring; ++r) members.push_back(rank_of(shape, {me.dp, r, me.ulysses}));
      break;
    case MeshAxis::ulysses:
      for (int u = 0; u < shape.ulysses; ++u) members.push_back(rank_of(shape, {me.dp, me.ring, u}));
      break;
    case MeshAxis::context:
      for (int r = 0; r < shape.ring; ++r)
        for (int u = 0; u < shape.ulysses; ++u) members.push_back(rank_of(shape, {me.dp, r, u}));
      break;
  }
  return members;
}

}  // namespace mmsp::dist
