// The mesh's axes and their arithmetic; see mesh.h.
#include "mmsp/plan/mesh.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "mmsp/core/check.h"

namespace mmsp::plan {

Layout parse_layout(const std::string& name) {
  if (name == "zigzag") return Layout::zigzag;
  if (name == "contiguous") return Layout::contiguous;
  MMSP_FAIL("layout \"", name, "\" is unknown; use zigzag or contiguous");
}

const char* to_string(Layout layout) { return layout == Layout::zigzag ? "zigzag" : "contiguous"; }

const std::vector<AxisSpec>& mesh_axes() {
  using K = AxisKind;
  static const std::vector<AxisSpec> axes = {
      {MeshAxis::world, "world", "w", K::flattened, {}},  // no parts listed: every dimension
      {MeshAxis::dp, "dp", "dp", K::dimension, {}, &Mesh::dp, &RankCoords::dp, "data-parallel replicas"},
      {MeshAxis::ring, "ring", "r", K::dimension, {}, &Mesh::ring, &RankCoords::ring, "ring-attention degree"},
      {MeshAxis::ulysses,
       "ulysses",
       "u",
       K::dimension,
       {},
       &Mesh::ulysses,
       &RankCoords::ulysses,
       "Ulysses degree (default: world / (dp * ring))"},
      {MeshAxis::context, "context", "c", K::flattened, {MeshAxis::ring, MeshAxis::ulysses}},
      {MeshAxis::expert,
       "expert",
       "e",
       K::folded,
       {},
       &Mesh::expert,
       nullptr,
       "expert-parallel degree: each MoE layer's experts split over blocks of this many consecutive ranks "
       "(folded into dp x ring x ulysses: adds no ranks)"},
      {MeshAxis::expert_replica, "expert_replica", "er", K::folded},
  };
  return axes;
}

const AxisSpec& axis_spec(MeshAxis axis) {
  const AxisSpec& spec = mesh_axes().at(static_cast<size_t>(axis));
  MMSP_ASSERT(spec.axis == axis, "mesh_axes() is not in MeshAxis order");
  return spec;
}

const char* axis_name(MeshAxis axis) { return axis_spec(axis).name; }

std::optional<MeshAxis> axis_named(std::string_view name) {
  for (const AxisSpec& spec : mesh_axes())
    if (name == spec.name) return spec.axis;
  return std::nullopt;
}

namespace {

std::vector<const AxisSpec*> dimensions() {  // slowest first
  std::vector<const AxisSpec*> dims;
  for (const AxisSpec& spec : mesh_axes())
    if (spec.kind == AxisKind::dimension) dims.push_back(&spec);
  return dims;
}

// A flattened axis's dimensions (world: every one); a dimension alone.
std::vector<MeshAxis> parts_of(const AxisSpec& spec) {
  if (spec.kind == AxisKind::dimension) return {spec.axis};
  if (!spec.parts.empty()) return spec.parts;
  std::vector<MeshAxis> all;
  for (const AxisSpec* d : dimensions()) all.push_back(d->axis);
  return all;
}

// "--dp, --ring and --ulysses"
std::string dimension_flags() {
  const std::vector<const AxisSpec*> dims = dimensions();
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i)
    out += (i == 0 ? "" : i + 1 == dims.size() ? " and " : ", ") + std::string("--") + dims[i]->name;
  return out;
}

}  // namespace

std::vector<MeshAxis> axis_dimensions(MeshAxis axis) {
  const AxisSpec& spec = axis_spec(axis);
  MMSP_ASSERT(spec.kind != AxisKind::folded, "a folded axis spans no dimensions");
  return parts_of(spec);
}

int Mesh::size(MeshAxis axis) const {
  const AxisSpec& spec = axis_spec(axis);
  switch (spec.kind) {
    case AxisKind::dimension:
      return this->*spec.size;
    case AxisKind::flattened: {
      int n = 1;
      for (MeshAxis p : parts_of(spec)) n *= size(p);
      return n;
    }
    case AxisKind::folded:
      break;
  }
  return axis == MeshAxis::expert ? expert : world() / expert;  // expert_replica: one rank per block
}

std::string Mesh::str() const {
  std::ostringstream out;
  const char* sep = "";
  for (const AxisSpec* d : dimensions()) {
    out << sep << d->name << "(" << this->*d->size << ")";
    sep = " × ";
  }
  if (expert != 1) out << ", expert(" << expert << ")";
  return out.str();
}

void validate_mesh(const Mesh& mesh, int64_t world_size) {
  int64_t product = 1;
  for (const AxisSpec* d : dimensions()) {
    MMSP_CHECK(mesh.*d->size >= 1, "mesh factors must be >= 1, got ", mesh.str());
    product *= mesh.*d->size;
    MMSP_CHECK(product <= (int64_t{1} << 24), "mesh ", mesh.str(), " is beyond the 2^24 ranks the planner supports");
  }
  MMSP_CHECK(world_size < 0 || product == world_size, "world size ", world_size, " is not ", mesh.str(), " = ", product,
             "; choose ", dimension_flags(), " whose product is ", world_size);
  MMSP_CHECK(mesh.expert >= 1 && product % mesh.expert == 0, "--expert ", mesh.expert, " must divide the world of ",
             product, " ranks (", mesh.str(), "): the experts are split over blocks of that many consecutive ranks");
}

Mesh parse_mesh(const std::string& text) {
  Mesh mesh;
  std::istringstream in(text);
  bool ok = true;
  const std::vector<const AxisSpec*> dims = dimensions();
  for (size_t i = 0; i < dims.size() && ok; ++i) {
    int factor = 0;
    ok = static_cast<bool>(in >> factor) && factor >= 1 && (i + 1 == dims.size() || in.get() == 'x');
    mesh.*dims[i]->size = factor;
  }
  MMSP_CHECK(ok && in.peek() == std::char_traits<char>::eof(), "mesh '", text,
             "' must read DPxRINGxULYSSES with factors >= 1, e.g. 1x2x2");
  return mesh;
}

namespace {
void factorise(const std::vector<const AxisSpec*>& dims, size_t i, int rest, Mesh mesh, std::vector<Mesh>& out) {
  if (i + 1 == dims.size()) {  // the fastest dimension takes what is left
    mesh.*dims[i]->size = rest;
    out.push_back(mesh);
    return;
  }
  for (int f = 1; f <= rest; ++f)
    if (rest % f == 0) {
      mesh.*dims[i]->size = f;
      factorise(dims, i + 1, rest / f, mesh, out);
    }
}
}  // namespace

std::vector<Mesh> all_meshes(int world_size) {
  std::vector<Mesh> meshes;
  factorise(dimensions(), 0, world_size, Mesh{}, meshes);
  return meshes;
}

RankCoords rank_coords(const Mesh& mesh, int rank) {
  MMSP_CHECK(rank >= 0 && rank < mesh.world(), "rank ", rank, " is outside the world of ", mesh.world(), " ranks (",
             mesh.str(), ")");
  RankCoords c;
  const std::vector<const AxisSpec*> dims = dimensions();
  for (auto d = dims.rbegin(); d != dims.rend(); ++d) {  // the fastest-varying first
    c.*(*d)->coordinate = rank % (mesh.*(*d)->size);
    rank /= mesh.*(*d)->size;
  }
  return c;
}

int global_rank(const Mesh& mesh, const RankCoords& c) {
  int rank = 0;
  for (const AxisSpec* d : dimensions()) rank = rank * (mesh.*d->size) + c.*d->coordinate;
  return rank;
}

std::vector<int> group_members(const Mesh& mesh, MeshAxis axis, int rank) {
  const RankCoords me = rank_coords(mesh, rank);
  const AxisSpec& spec = axis_spec(axis);
  std::vector<int> members;
  if (spec.kind == AxisKind::folded) {
    const int E = mesh.expert;
    if (axis == MeshAxis::expert)
      for (int i = 0; i < E; ++i) members.push_back(rank / E * E + i);
    else
      for (int r = rank % E; r < mesh.world(); r += E) members.push_back(r);
    return members;
  }
  // The axis's dimensions vary (the others stay mine), the slowest outermost: the world's order.
  const std::vector<MeshAxis> varying = parts_of(spec);
  const int n = mesh.size(axis);
  for (int i = 0; i < n; ++i) {
    RankCoords c = me;
    int rest = i;
    for (auto d = varying.rbegin(); d != varying.rend(); ++d) {
      const AxisSpec& dim = axis_spec(*d);
      c.*dim.coordinate = rest % (mesh.*dim.size);
      rest /= mesh.*dim.size;
    }
    members.push_back(global_rank(mesh, c));
  }
  return members;
}

std::string group_name(const Mesh& mesh, MeshAxis axis, int rank) {
  std::ostringstream out;
  out << axis_name(axis);
  if (axis == MeshAxis::expert) {
    out << "[block=" << rank / mesh.expert << "]";
  } else if (axis == MeshAxis::expert_replica) {
    out << "[e=" << rank % mesh.expert << "]";
  } else {
    const std::vector<MeshAxis> spans = axis_dimensions(axis);
    const RankCoords me = rank_coords(mesh, rank);
    const char* sep = "[";
    for (const AxisSpec* d : dimensions()) {
      if (std::find(spans.begin(), spans.end(), d->axis) != spans.end()) continue;
      out << sep << d->label << "=" << me.*d->coordinate;
      sep = ",";
    }
    if (*sep == ',') out << "]";
  }
  return out.str();
}

}  // namespace mmsp::plan
