// The device mesh as a value, its axes named and defined once (mesh_axes(): torchtitan's
// ParallelDims, as a table). Dimensions multiply to the world, the table's order from
// slowest to fastest-varying (a rank's Ulysses peers are its neighbours); flattened axes are
// products of dimensions (context = ring × ulysses); folded axes are drawn from the world's
// ranks without adding any (expert: blocks of consecutive ranks, as VeOmni and Megatron fold
// expert parallelism into the data and context ranks). Pure index arithmetic — a rank's
// coordinates and the members of each axis's group — for the planner and for dist::Mesh,
// which builds one process group per axis of the table; no communication.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mmsp::plan {

enum class Layout { zigzag, contiguous };
Layout parse_layout(const std::string& name);
const char* to_string(Layout layout);

// Every axis of the mesh. kMeshAxes counts them (arrays indexed by an axis).
enum class MeshAxis { world, dp, ring, ulysses, context, expert, expert_replica };
inline constexpr int kMeshAxes = 7;

struct Mesh {
  int dp = 1;       // data-parallel replicas
  int ring = 1;     // ring-attention degree (K/V travel round the ring)
  int ulysses = 1;  // Ulysses degree (all-to-all tokens <-> heads)
  int expert = 1;   // expert-parallel degree: folded into the world's ranks (adds none)

  int size(MeshAxis axis) const;  // a group's size along the axis (from mesh_axes())
  int world() const { return size(MeshAxis::world); }
  int context() const { return size(MeshAxis::context); }  // sequence-parallel group size
  std::string str() const;  // "dp(1) × ring(2) × ulysses(2)", then ", expert(2)" if any
};

// A rank's coordinate on each dimension.
struct RankCoords {
  int dp = 0, ring = 0, ulysses = 0;
  int context_rank(const Mesh& mesh) const { return ring * mesh.ulysses + ulysses; }
};

enum class AxisKind {
  dimension,  // its own factor of the world
  flattened,  // the product of `parts` (dimensions), e.g. context = ring × ulysses; world = every dimension
  folded,     // drawn from the world's ranks, adding none (expert parallelism)
};

struct AxisSpec {
  MeshAxis axis;
  const char* name;   // in flags (--NAME), messages, plans and Python (mmsp.Mesh(NAME=...))
  const char* label;  // in the names of other axes' groups: "ring[dp=0,u=1]"
  AxisKind kind;
  std::vector<MeshAxis> parts;            // flattened: its dimensions, slowest first
  int Mesh::*size = nullptr;              // dimension and folded: the Mesh's field
  int RankCoords::*coordinate = nullptr;  // dimension: the RankCoords' field
  const char* help = "";                  // the flag's help (dimension and folded)
};

// Every axis, in the order every rank builds their groups (dist::Mesh); the dimensions among
// them slowest first.
const std::vector<AxisSpec>& mesh_axes();
const AxisSpec& axis_spec(MeshAxis axis);
const char* axis_name(MeshAxis axis);
std::optional<MeshAxis> axis_named(std::string_view name);  // nullopt for an unknown name
// The dimensions a dimension or flattened axis spans, slowest first (world: every one).
std::vector<MeshAxis> axis_dimensions(MeshAxis axis);

// Throws mmsp::Error unless every factor is >= 1, the world is at most 2^24 ranks,
// the expert degree divides the world and, when world_size >= 0, the dimensions multiply
// to it: "world size 6 is not dp(1) × ring(2) × ulysses(2) = 4; choose --dp, ...".
void validate_mesh(const Mesh& mesh, int64_t world_size = -1);

// Parses "DxRxU" (e.g. "1x2x2"); throws on anything else.
Mesh parse_mesh(const std::string& text);

// Every factorisation dp × ring × ulysses of world_size (expert 1), in a fixed order.
std::vector<Mesh> all_meshes(int world_size);

RankCoords rank_coords(const Mesh& mesh, int rank);           // throws unless 0 <= rank < world
int global_rank(const Mesh& mesh, const RankCoords& coords);  // the inverse of rank_coords

// Global ranks of the group along `axis` that contains `rank`, ordered by the group-local
// rank: a dimension's or flattened axis's members share the other dimensions' coordinates,
// ordered as the world orders them; expert: the block of `expert` consecutive ranks;
// expert_replica: the ranks at the same place in every block (those holding the same experts).
std::vector<int> group_members(const Mesh& mesh, MeshAxis axis, int rank);

// The name of that group in messages and stores: the axis and the coordinates every member
// shares ("ring[dp=0,u=1]", "context[dp=1]", "world"); a folded axis's block or place in the
// blocks ("expert[block=1]", "expert_replica[e=0]").
std::string group_name(const Mesh& mesh, MeshAxis axis, int rank);

}  // namespace mmsp::plan
